"""``meshrl validate JOB.yaml [a.b=c ...]``: check a job spec and print it resolved."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="job spec YAML")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-6 rollout.n=4")


def run(args: argparse.Namespace) -> int:
    import sys

    from services.config.job import JobSpecError, dump_job, load_job

    try:
        spec = load_job(args.spec, args.overrides)
    except JobSpecError as exc:
        print(f"{args.spec}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(dump_job(spec))
    return 0
