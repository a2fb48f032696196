"""``python -m reward_svc --config reward.yaml [--id NAME] [--no-queue] [a.b=c ...]``: one reward worker.

The file is the reward view of a job (:class:`services.config.views.RewardView`; written by
``meshrl run`` or ``meshrl views``)::

    service: reward
    reward: {tokenizer_path: /path/to/tokenizer, custom_reward_function: {...}, ...}
    resources: {device: cpu, host: 127.0.0.1, grpc_port: 0, metrics_port: 0}
    queues: {type: redis, url: redis://127.0.0.1:6379/0}     # null: gRPC Score only

The command line and the view are checked before torch or anything heavy is imported, so
``--help`` is instant. When ready the process announces it with the one
``MESHRL_READY {...}`` line (``services.readiness``: addresses ``metrics`` and, when on,
``grpc``).
"""

from __future__ import annotations

import os
import socket
import sys


def parse_args(argv: list[str] | None = None):
    from services.entrypoint import parse_with_overrides, service_parser

    p = service_parser("reward", "meshrl reward service", default_id=None)
    p.add_argument("--no-queue", action="store_true", help="serve gRPC Score only; do not consume a stream")
    return parse_with_overrides(p, argv)


async def _serve(args, view) -> int:
    import asyncio
    import signal

    from reward_svc.decode import load_decoder
    from reward_svc.server import RewardServer
    from services.readiness import announce_ready

    consumer = args.id or f"reward-{socket.gethostname()}-{os.getpid()}"
    server = RewardServer(view.reward, load_decoder(view.reward.tokenizer_path),
                          queue_cfg=None if args.no_queue else view.queues, consumer=consumer, resources=view.resources)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: leave now
            os._exit(130)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await server.start()
    addresses = {"metrics": f"{server.http.host}:{server.http.port}"}
    if server.grpc_port:
        addresses["grpc"] = f"{view.resources.host}:{server.grpc_port}"
    announce_ready("reward", consumer, addresses, device=view.resources.device)
    try:
        await server.run(stop)
    finally:
        await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    from services.config.loader import ConfigError
    from services.config.views import RewardView
    from services.entrypoint import load_view_or_exit, pin_or_exit

    args = parse_args(argv)
    view = load_view_or_exit(RewardView, args, "reward")
    pin_or_exit(view.resources.cpus, "services.reward.cpus", "reward")
    import asyncio
    import logging

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from services.sandbox.process import SandboxStartError

    try:
        return asyncio.run(_serve(args, view))
    except (ConfigError, SandboxStartError, FileNotFoundError) as exc:
        print(f"reward: cannot start: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
