"""The chunked form over a real gRPC server on loopback: a frame larger than gRPC's default
4 MiB message limit streams as FrameChunk messages, is joined, decoded zero-copy, changed,
and streamed back; a broken chunk stream gets INVALID_ARGUMENT naming the problem."""

from __future__ import annotations

from concurrent import futures

import grpc
import numpy as np
import pytest
import torch

from services import wire
from services.pb import frame_pb2
from services.protocol import DataProto

METHOD = "/meshrl.test.FrameEcho/Echo"
pytestmark = pytest.mark.timeout(120)


def _echo(request_iterator, context):
    """Join the incoming frame, add 1 to `ids` in place (zero-copy view), send it back."""
    try:
        frame = wire.join_chunks(request_iterator, max_frame_bytes=64 << 20)
        data = wire.decode(frame)
    except wire.WireError as e:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    data.batch["ids"].add_(1)
    data.meta_info["echoed"] = True
    yield from wire.iter_chunks(wire.encode_parts(data), 1 << 20)


@pytest.fixture(scope="module")
def channel():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "meshrl.test.FrameEcho",
        {"Echo": grpc.stream_stream_rpc_method_handler(
            _echo,
            request_deserializer=frame_pb2.FrameChunk.FromString,
            response_serializer=frame_pb2.FrameChunk.SerializeToString,
        )},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(ch).result(timeout=30)
    try:
        yield ch
    finally:
        ch.close()
        server.stop(grace=None).wait(timeout=10)


def _call(channel):
    return channel.stream_stream(
        METHOD,
        request_serializer=frame_pb2.FrameChunk.SerializeToString,
        response_deserializer=frame_pb2.FrameChunk.FromString,
    )


def test_frame_larger_than_one_message_round_trips_over_grpc(channel):
    b, t = 16, 48 * 1024  # 6 MiB of int64 ids + 3 MiB of float32: over the 4 MiB limit
    data = DataProto.from_dict(
        tensors={"ids": torch.arange(b * t).view(b, t), "lp": torch.randn(b, t)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(b)], dtype=object)},
        meta_info={"step": 3},
    )
    frame = wire.encode(data)
    assert len(frame) > 4 << 20
    replies = _call(channel)(wire.iter_chunks(frame, 1 << 20), timeout=60)
    back = wire.decode(wire.join_chunks(replies, max_frame_bytes=64 << 20))
    assert torch.equal(back.batch["ids"], data.batch["ids"] + 1)
    assert torch.equal(back.batch["lp"], data.batch["lp"])
    assert back.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert back.meta_info == {"step": 3, "echoed": True}


def test_broken_chunk_stream_is_rejected_with_invalid_argument(channel):
    data = DataProto.from_dict(tensors={"ids": torch.arange(4096).view(4, 1024)})
    chunks = list(wire.iter_chunks(wire.encode(data), 1000))
    del chunks[2]  # a gap
    with pytest.raises(grpc.RpcError) as err:
        list(_call(channel)(iter(chunks), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "expected seq 2" in err.value.details()
