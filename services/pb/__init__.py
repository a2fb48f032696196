"""Protobuf / gRPC stubs generated from ``proto/*.proto``.

Import the generated modules from here, e.g. ``from services.pb import frame_pb2``.
In a source checkout the stubs are (re)generated on first import when the ``.proto``
files changed; see :mod:`services.pb._gen`.
"""

from services.pb import _gen

if _gen.needs_generation():
    _gen.generate()
