"""A fresh copy of the tracked files, once its install step has generated the protobuf stubs,
imports every module of the four packages and writes nothing into the tree (no stubs, no
stamps, no caches beside the sources); without that step, ``services.pb`` says what to run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "trainer_svc", "rollout_svc", "reward_svc")

IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
imported, failed, origins = [], {}, {}
for pkg in sys.argv[1:]:
    top = importlib.import_module(pkg)
    origins[pkg] = top.__file__
    for info in pkgutil.walk_packages(top.__path__, pkg + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # entrypoints run their CLI when imported
        try:
            importlib.import_module(info.name)
            imported.append(info.name)
        except Exception as exc:  # reported, not hidden: the test fails on any
            failed[info.name] = repr(exc)
print(json.dumps({"imported": imported, "failed": failed, "origins": origins}))
"""


def _tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [name for name in out.stdout.decode().split("\0") if name]


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_fresh_copy_imports_every_module_without_writing(tmp_path: Path) -> None:
    copy = tmp_path / "meshrl"
    for name in _tracked_files():
        src = ROOT / name
        if not src.exists():  # deleted in the working tree, not yet committed
            continue
        dst = copy / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    assert "services/pb/frame_pb2.py" not in _listing(copy), "the protobuf stubs are generated, not tracked"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")

    # Before the install step: a clear error naming the command, and nothing written.
    bare = _listing(copy)
    proc = subprocess.run([sys.executable, "-c", "import services.pb"], cwd=copy, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode != 0 and "scripts/gen_proto.py" in proc.stderr, proc.stderr[-2000:]
    assert _listing(copy) == bare

    # The install step (scripts/install.sh runs this) writes the stubs, and only them.
    subprocess.run([sys.executable, "scripts/gen_proto.py"], cwd=copy, env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    before = _listing(copy)
    assert {p for p in before - bare if not p.startswith("services/pb/")} == set()
    assert "services/pb/frame_pb2.py" in before

    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, *PACKAGES], cwd=copy, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for pkg, origin in report["origins"].items():
        assert Path(origin).is_relative_to(copy), f"{pkg} was imported from {origin}, not from the copy"
    assert report["failed"] == {}
    expected = {
        name[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for name in before
        if name.endswith(".py") and name.split("/", 1)[0] in PACKAGES and not name.endswith("__main__.py")
    }
    assert expected - set(PACKAGES) <= set(report["imported"]), sorted(expected - set(report["imported"]))

    written = _listing(copy) - before
    assert written == set(), f"importing wrote into the tree: {sorted(written)}"
