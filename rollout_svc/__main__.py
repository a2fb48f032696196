"""``python -m rollout_svc --config job.yaml [a.b=c ...]``: run one rollout replica.

Arguments are parsed before torch/vLLM are imported (``--help`` is instant). Once the
engine is loaded the process prints one line ``READY {"grpc_port": ..., "metrics_port": ...}``
on stdout (launchers and tests wait for it), then serves until SIGTERM/SIGINT: it stops
leasing, finishes and delivers the groups in flight, and exits 0.
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rollout_svc", description="Run one meshrl rollout replica (vLLM).")
    p.add_argument("--config", required=True, help="resolved job spec YAML (blocks model, data, rollout, queues, weights)")
    p.add_argument("--name", default="rollout-0", help="replica name (consumer name on the prompts stream)")
    p.add_argument("--grpc-port", type=int, default=None, help="override rollout.grpc_port")
    p.add_argument("--metrics-port", type=int, default=None, help="override rollout.metrics_port")
    p.add_argument("overrides", nargs="*", help="OmegaConf-style overrides, e.g. rollout.n=4")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rollout_svc.settings import SettingsError, load_settings

    overrides = list(args.overrides)
    if args.grpc_port is not None:
        overrides.append(f"rollout.grpc_port={args.grpc_port}")
    if args.metrics_port is not None:
        overrides.append(f"rollout.metrics_port={args.metrics_port}")
    try:
        settings = load_settings(args.config, overrides)
    except SettingsError as exc:
        print(f"rollout_svc: {exc}", file=sys.stderr)
        return 2
    import asyncio

    from rollout_svc.replica_process import serve

    return asyncio.run(serve(settings, name=args.name))


if __name__ == "__main__":
    sys.exit(main())
