"""Generate the Python stubs for ``proto/*.proto`` into this package.

The stubs are build products, never edited by hand and never committed. They are made
by ``make proto`` (``python -m services.pb._gen``), by the package build (``setup.py``),
and, as a last resort, on first import of :mod:`services.pb` from a source checkout when
the ``.proto`` files changed since the last generation (a stamp holds their hash).

protoc writes absolute imports (``import frame_pb2``) between generated modules; we
rewrite them to package-relative ones so the stubs live inside ``services.pb``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import sys
from pathlib import Path

PB_DIR = Path(__file__).resolve().parent
PROTO_DIR = PB_DIR.parent.parent / "proto"
STAMP = PB_DIR / ".stamp"

_IMPORT_RE = re.compile(r"^import (\w+_pb2)( as \w+)?$", re.MULTILINE)


def _proto_files(proto_dir: Path) -> list[Path]:
    return sorted(proto_dir.glob("*.proto"))


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def needs_generation(proto_dir: Path = PROTO_DIR, out_dir: Path = PB_DIR) -> bool:
    files = _proto_files(proto_dir)
    if not files:  # installed from a wheel: the stubs shipped with it
        return False
    stamp = out_dir / ".stamp"
    return not stamp.exists() or stamp.read_text().strip() != _digest(files)


def generate(proto_dir: Path = PROTO_DIR, out_dir: Path = PB_DIR) -> list[Path]:
    """Run protoc over every ``.proto`` in ``proto_dir``; return the modules written."""
    from grpc_tools import protoc  # build-time dependency, imported lazily

    files = _proto_files(proto_dir)
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir / ".gen.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several processes may import at once
        if not needs_generation(proto_dir, out_dir) and (out_dir / ".stamp").exists():
            return []
        import grpc_tools

        well_known = Path(grpc_tools.__file__).parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{proto_dir}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *[str(f) for f in files],
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(args)}")
        written = sorted(out_dir.glob("*_pb2*.py")) + sorted(out_dir.glob("*_pb2.pyi"))
        for mod in written:
            text = mod.read_text()
            fixed = _IMPORT_RE.sub(lambda m: f"from . import {m.group(1)}{m.group(2) or ''}", text)
            if fixed != text:
                mod.write_text(fixed)
        tmp = out_dir / ".stamp.tmp"
        tmp.write_text(_digest(files) + "\n")
        os.replace(tmp, out_dir / ".stamp")
        return written


def main() -> int:
    written = generate()
    for p in written:
        print(p.relative_to(Path.cwd()) if p.is_relative_to(Path.cwd()) else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
