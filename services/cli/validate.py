"""``meshrl validate JOB.yaml [a.b=c ...]``: check a job spec and print it resolved."""

from __future__ import annotations

import argparse

from services.cli.common import add_spec_arguments, check_inputs_or_report, load_spec_or_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)


def run(args: argparse.Namespace) -> int:
    import sys

    from services.config.job import dump_job

    spec = load_spec_or_report(args)
    if spec is None or not check_inputs_or_report(spec, args.spec):
        return 2
    sys.stdout.write(dump_job(spec))
    return 0
