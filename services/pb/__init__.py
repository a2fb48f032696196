"""Protobuf / gRPC stubs of ``proto/*.proto``, e.g. ``from services.pb import frame_pb2``.

The stubs are generated, not tracked: ``scripts/install.sh`` (and the container build) runs
``scripts/gen_proto.py`` once at install time; after editing a ``.proto`` run ``make proto``.
Nothing is generated at import time: a checkout without the stubs fails here with the
command that makes them. ``tests/unit/test_pb_stubs.py`` checks that the stubs in place are
the ones the ``.proto`` files give.
"""

from pathlib import Path

if not (Path(__file__).parent / "frame_pb2.py").exists():
    raise ImportError(
        "the protobuf stubs in services/pb are not generated: run `python scripts/gen_proto.py` "
        "(or `make proto`; scripts/install.sh does it)"
    )
