"""The launcher registry: every kind names a class of that kind, unknown kinds are refused,
and a launcher's module (with what it imports, Ray among them) is imported only when asked for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gateway_svc.launchers.base import LaunchError, Launcher
from gateway_svc.launchers.registry import LAUNCHERS, launcher_class, make_launcher


@pytest.mark.parametrize("kind", sorted(LAUNCHERS))
def test_each_kind_names_a_launcher_of_that_kind(kind):
    cls = launcher_class(kind)
    assert issubclass(cls, Launcher) and cls.kind == kind


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(LaunchError, match="unknown launcher 'slurm'.*'local'.*'ray'.*'deployment'"):
        make_launcher("slurm")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_interface_and_the_registry_import_no_launcher():
    loaded = _modules_after("import gateway_svc.launchers.registry")
    assert not {f"gateway_svc.launchers.{k}" for k in LAUNCHERS} & loaded


def test_a_local_launcher_does_not_import_ray():
    loaded = _modules_after("from gateway_svc.launchers.registry import make_launcher; make_launcher('local')")
    assert "gateway_svc.launchers.local" in loaded
    assert "ray" not in loaded and "gateway_svc.launchers.ray" not in loaded
