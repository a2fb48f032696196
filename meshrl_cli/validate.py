"""``meshrl validate JOB.yaml [a.b=c ...]``: check a job spec and print it resolved.

Checks, each problem one line ``<dotted.key>: <what is wrong> (<what to do>)``: the schema
(types, bounds, unknown keys), the files it names (model, data, reward function), and the
registry names it uses (estimators, losses, scorers, tool parsers, loggers; with "did you
mean"). ``meshrl validate --schema`` (or ``meshrl config``) lists every key instead.
"""

from __future__ import annotations

import argparse

from services.entrypoint import check_inputs_or_report, load_spec_or_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="job spec YAML")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-6 rollout.n=4")
    p.add_argument("--schema", action="store_true",
                   help="print every key of a job spec with its type, default and description, and exit")


def print_schema() -> int:
    import sys

    from services.config.job import JobSpec
    from services.config.schema_doc import format_schema

    sys.stdout.write(format_schema(JobSpec))
    return 0


def run(args: argparse.Namespace) -> int:
    import sys

    from services.config.job import dump_job

    if args.schema:
        return print_schema()
    if not args.spec:
        raise ValueError("give a job spec file (e.g. examples/quickstart.yaml), or --schema to list every key")
    spec = load_spec_or_report(args)
    if spec is None or not check_inputs_or_report(spec, args.spec):
        return 2
    sys.stdout.write(dump_job(spec))
    return 0
