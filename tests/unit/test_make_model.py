"""``meshrl make-model``: names, arguments and refusals (no conversion here: the real
conversion of SmolLM2 runs once per session in tests/integration/test_real_model.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.modelling import gguf


def _meshrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshrl_cli", "make-model", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_names_match_the_known_models() -> None:
    from meshrl_cli import make_model

    assert set(make_model.KNOWN) == set(gguf.KNOWN_MODELS)


def test_known_model_is_found_in_its_installed_package() -> None:
    path = gguf.known_gguf("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert path.read_bytes()[:4] == b"GGUF"


def test_unknown_name_and_missing_package_say_what_to_do(monkeypatch) -> None:
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        gguf.known_gguf("smollm3")
    monkeypatch.setitem(gguf.KNOWN_MODELS, "ghost", gguf.KnownModel("no_such_pkg_xyz", "g.gguf", "pip install ghost", "MIT"))
    with pytest.raises(FileNotFoundError, match="pip install ghost"):
        gguf.known_gguf("ghost")


def test_refuses_a_foreign_directory_and_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    src = gguf.known_gguf("smollm2-135m-instruct")
    with pytest.raises(FileExistsError, match="refusing"):
        gguf.convert_gguf(src, tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    with pytest.raises(FileNotFoundError):
        gguf.convert_gguf(tmp_path / "none.gguf", tmp_path / "out")
    with pytest.raises(ValueError, match="dtype"):
        gguf.convert_gguf(src, tmp_path / "out", dtype="int8")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["smollm3", "DIR"], "unknown model 'smollm3'"),
        (["DIR"], "give a model name and a directory"),
        (["--gguf", "x.gguf", "NAME", "DIR"], "give only the output directory"),
        (["--gguf", "/nonexistent/x.gguf", "DIR"], "not found"),
    ],
)
def test_cli_errors_are_one_line_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(tmp_path / a) if a == "DIR" else a for a in args]
    r = _meshrl(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
