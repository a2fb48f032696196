"""``python -m reward_svc --config FILE``: run one reward service process.

FILE is either a whole job spec (``services.config.job``; its ``reward`` and ``queues``
blocks are used, and the model's tokenizer unless ``reward.tokenizer_path`` is set) or a
standalone file::

    reward: {tokenizer_path: /path/to/tokenizer, custom_reward_function: {...}, ...}
    queues: {type: redis, url: redis://127.0.0.1:6379/0}     # omit for gRPC-only

Trailing ``a.b=c`` arguments override keys (OmegaConf style). The command line is parsed
before torch or anything heavy is imported, so ``--help`` is instant. When ready the
process prints one line ``reward ready grpc=<host:port|off> metrics=<host:port>``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m reward_svc", description="meshrl reward service")
    p.add_argument("--config", required=True, help="job spec or standalone reward service YAML")
    p.add_argument("--consumer", default=None, help="consumer name in the group (default reward-<host>-<pid>)")
    p.add_argument("--no-queue", action="store_true", help="serve gRPC Score only; do not consume a stream")
    p.add_argument("--log-level", default="INFO", help="logging level")
    p.add_argument("overrides", nargs="*", help="a.b=c overrides")
    return p.parse_args(argv)


def load_config(path: str, overrides: list[str]) -> tuple[object, object, str]:
    """``(RewardConfig, queue config or None, tokenizer path)`` from a job spec or a standalone file."""
    import yaml

    from services.config.job import JobSpecError, apply_overrides, format_validation_error, load_job
    from services.config.reward import RewardConfig

    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise JobSpecError(f"{path}: expected a mapping at the top level")
    if "model" in raw:  # a whole job spec
        spec = load_job(path, overrides)
        reward = getattr(spec, "reward", None) or RewardConfig()
        queues = getattr(spec, "queues", None)
        tok = reward.tokenizer_path or spec.model.tokenizer_path or spec.model.path
        return reward, queues, tok
    from pydantic import ValidationError

    from services.config.queues import parse_queue_config

    raw = apply_overrides(raw, overrides)
    unknown = set(raw) - {"reward", "queues"}
    if unknown:
        raise JobSpecError(f"{path}: unknown top-level keys {sorted(unknown)} (expected reward, queues)")
    try:
        reward = RewardConfig.model_validate(raw.get("reward") or {})
        queues = parse_queue_config(raw["queues"]) if raw.get("queues") else None
    except ValidationError as exc:
        raise JobSpecError(format_validation_error(exc)) from None
    if not reward.tokenizer_path:
        raise JobSpecError(f"{path}: reward.tokenizer_path is required in a standalone reward config")
    return reward, queues, reward.tokenizer_path


async def _serve(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from reward_svc.decode import load_decoder
    from reward_svc.server import RewardServer

    cfg, queues, tok = load_config(args.config, args.overrides)
    consumer = args.consumer or f"reward-{socket.gethostname()}-{os.getpid()}"
    server = RewardServer(cfg, load_decoder(tok), queue_cfg=None if args.no_queue else queues, consumer=consumer)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    def on_signal() -> None:
        if stop.is_set():  # a second signal: leave now
            os._exit(130)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await server.start()
    grpc_addr = f"{cfg.host}:{server.grpc_port}" if server.grpc_port else "off"
    print(f"reward ready grpc={grpc_addr} metrics={server.http.host}:{server.http.port}", flush=True)
    try:
        await server.run(stop)
    finally:
        await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import asyncio
    import logging

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from reward_svc.sandbox.pool import SandboxStartError
    from services.config.job import JobSpecError

    try:
        return asyncio.run(_serve(args))
    except (JobSpecError, SandboxStartError, FileNotFoundError) as exc:
        print(f"reward: cannot start: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
