"""Every ``meshrl`` failure is one line naming what to fix; the traceback only with --debug."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from services.failures import describe


def test_describe_makes_one_line_per_kind_of_failure(tmp_path):
    try:
        open(tmp_path)  # noqa: SIM115 - a directory
    except OSError as exc:
        assert describe(exc) == (f"{tmp_path}: Is a directory (expected a file, got a directory)", 2)
    assert describe(OSError(errno.EADDRINUSE, "Address already in use")) == \
        ("Address already in use (choose another port)", 2)
    assert describe(ValueError("invalid job spec:\n  a.b: bad\n  c: worse")) == ("invalid job spec:; a.b: bad; c: worse", 2)
    from pydantic import BaseModel, ValidationError

    class M(BaseModel):
        n: int

    with pytest.raises(ValidationError) as info:
        M(n="x")
    assert describe(info.value)[0].startswith("n: Input should be a valid integer") and describe(info.value)[1] == 2
    line, code = describe(RuntimeError("boom\nsecond line"))
    assert code == 1 and line == "internal error: RuntimeError: boom; second line (rerun with --debug for the traceback)"


def _meshrl(*args, env=None):
    return subprocess.run([sys.executable, "-m", "meshrl_cli", *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_gateway_on_a_taken_port_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _meshrl("gateway", "--port", str(port), "--grpc-port", "-1", "--db", f"sqlite:///{tmp_path}/gw.db",
                    "--runs-dir", str(tmp_path / "runs"), env={"MESHRL_GATEWAY_TOKEN": "t" * 32})
    assert r.returncode == 2
    assert r.stderr == f"meshrl gateway: --port {port}: 127.0.0.1:{port} is already in use (choose another --port)\n"


def test_missing_spec_and_directory_spec(tmp_path):
    r = _meshrl("validate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "does not exist" in r.stderr
    r = _meshrl("run", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _meshrl("--debug", "validate", str(tmp_path))
    assert "Traceback" in r.stderr
