"""The console scripts of pyproject.toml's ``[project.scripts]``: each service's script runs the
same ``main`` as ``python -m <package>``, and every script answers ``--help`` (exit 0, a usage
line naming the script) when started the way pip's generated wrapper starts it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]

# What pip writes into the venv's bin/ for an entry "module:func" (the wrapper's shape).
WRAPPER = """import re
import sys
from {module} import {func}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({func}())
"""


SERVICES = sorted(name.removeprefix("meshrl-") for name in SCRIPTS if name.startswith("meshrl-"))


def test_every_service_has_a_script():
    assert {"trainer", "rollout", "reward", "feeder"} <= set(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_script_runs_what_python_m_runs(service):
    module, _, func = SCRIPTS[f"meshrl-{service}"].partition(":")
    assert getattr(importlib.import_module(module), func) is importlib.import_module(f"{service}_svc.__main__").main


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_answers_help(script, tmp_path):
    module, _, func = SCRIPTS[script].partition(":")
    wrapper = tmp_path / script
    wrapper.write_text(WRAPPER.format(module=module, func=func))
    out = subprocess.run([sys.executable, str(wrapper), "--help"], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: {script} "), out.stdout[:300]
