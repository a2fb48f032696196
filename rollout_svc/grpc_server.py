"""gRPC ``RolloutService`` of one replica (proto/rollout.proto), served with ``grpc.aio``.

Runs in the replica's event loop, next to the stream loop, sharing the same engine: a
direct ``Generate`` call is batched by vLLM together with the stream's requests.
"""

from __future__ import annotations

import logging

import grpc

from rollout_svc.engine import EngineDeadError
from rollout_svc.replica import Replica
from services import auth

log = logging.getLogger(__name__)

#: largest frame accepted/returned by Generate (a rollout batch of long sequences is big)
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


def _status_msg(replica: Replica):
    from services.pb import rollout_pb2

    return rollout_pb2.RolloutStatus(**replica.status())


def make_servicer(replica: Replica):
    """The ``RolloutServiceServicer`` implementation bound to ``replica``."""
    from services.pb import rollout_pb2, rollout_pb2_grpc

    class Servicer(rollout_pb2_grpc.RolloutServiceServicer):
        async def Generate(self, request, context):  # noqa: N802 (gRPC method name)
            from services import wire
            from services.protocol import DataProto

            try:
                data = wire.decode(bytearray(request.frame))
            except wire.WireError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: {exc}")
            if len(data) == 0:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "frame holds no prompt rows")
            try:
                outs = await replica.generate_item(data)
            except EngineDeadError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            return rollout_pb2.RolloutGenerateResponse(frame=bytes(wire.encode(DataProto.concat(outs))))

        async def Status(self, request, context):  # noqa: N802
            return _status_msg(replica)

        async def Pause(self, request, context):  # noqa: N802
            replica.pause()
            return _status_msg(replica)

        async def Resume(self, request, context):  # noqa: N802
            replica.resume()
            return _status_msg(replica)

    return Servicer()


async def start_grpc_server(replica: Replica, host: str, port: int,
                            credential: auth.JobCredential | None = None) -> tuple[grpc.aio.Server, int]:
    """Start the server on ``host:port`` (0 = free port); returns ``(server, bound_port)``.

    Every call must carry ``credential`` (default: the process's job credential)."""
    from services.pb import rollout_pb2_grpc

    credential = auth.resolve(credential)
    server = grpc.aio.server(
        interceptors=[credential.aio_server_interceptor()],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),  # never share a port with another server silently
        ]
    )
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(make_servicer(replica), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind RolloutService on {host}:{port}")
    await server.start()
    return server, bound
