"""The protobuf stubs in services/pb (generated at install time, not tracked) are exactly what
scripts/gen_proto.py makes from proto/*.proto now: a schema edited without `make proto` fails."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("meshrl_gen_proto", ROOT / "scripts" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stubs_in_place_match_the_proto_files(tmp_path: Path) -> None:
    gen = _generator()
    fresh = {p.name: p.read_bytes() for p in gen.generate(ROOT / "proto", tmp_path)}
    in_place = {p.name: p.read_bytes() for p in gen.stub_files(ROOT / "services" / "pb")}
    protos = sorted(p.stem for p in (ROOT / "proto").glob("*.proto"))
    assert sorted({name.split("_pb2")[0] for name in fresh}) == protos
    assert sorted(in_place) == sorted(fresh), "stub files missing or extra: run `make proto`"
    stale = [name for name in fresh if fresh[name] != in_place[name]]
    assert not stale, f"stale stubs {stale}: run `make proto` (python scripts/gen_proto.py)"


def test_generator_makes_imports_between_stubs_package_relative(tmp_path: Path) -> None:
    gen = _generator()
    relative = 0
    for path in gen.generate(ROOT / "proto", tmp_path):
        text = path.read_text()
        assert not re.search(r"^import \w+_pb2", text, re.MULTILINE), f"{path.name} imports a stub absolutely"
        relative += len(re.findall(r"^from \. import \w+_pb2", text, re.MULTILINE))
    assert relative > 0  # the *_pb2_grpc modules import their messages


def test_generator_refuses_an_empty_proto_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no .proto files"):
        _generator().generate(tmp_path / "none", tmp_path / "out")
