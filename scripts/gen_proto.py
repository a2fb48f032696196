"""Generate the Python protobuf/gRPC stubs of ``proto/*.proto`` into ``services/pb/``.

    python scripts/gen_proto.py            # or: make proto

The stubs are not tracked: ``scripts/install.sh`` and the container build run this once,
and ``make proto`` runs it again after a ``.proto`` is edited; nothing is generated at
import time. ``tests/unit/test_pb_stubs.py`` regenerates them into a temporary directory and
fails when the stubs in place differ (stale). It needs ``grpcio-tools`` (a dependency, pinned
so that the generated code matches the protobuf runtime).

protoc writes absolute imports (``import frame_pb2``) between generated modules; they are
rewritten to package-relative ones so the stubs live inside ``services.pb``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PB_DIR = ROOT / "services" / "pb"
STUB_GLOBS = ("*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi")

_IMPORT_RE = re.compile(r"^import (\w+_pb2)( as \w+)?$", re.MULTILINE)


def stub_files(out_dir: Path) -> list[Path]:
    """The generated stub files present in ``out_dir``, sorted by name."""
    return sorted(p for pattern in STUB_GLOBS for p in out_dir.glob(pattern))


def generate(proto_dir: Path = PROTO_DIR, out_dir: Path = PB_DIR) -> list[Path]:
    """Run protoc over every ``.proto`` in ``proto_dir`` into ``out_dir``; return the stubs."""
    import grpc_tools
    from grpc_tools import protoc

    files = sorted(proto_dir.glob("*.proto"))
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
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
    written = stub_files(out_dir)
    for mod in written:
        text = mod.read_text()
        fixed = _IMPORT_RE.sub(lambda m: f"from . import {m.group(1)}{m.group(2) or ''}", text)
        if fixed != text:
            mod.write_text(fixed)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=PB_DIR, help="output directory (default: services/pb)")
    args = p.parse_args(argv)
    for path in generate(PROTO_DIR, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
