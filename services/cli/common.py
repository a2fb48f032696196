"""Small helpers shared by the ``meshrl`` subcommands (no heavy imports)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    """The positional ``spec`` and ``overrides`` every job-spec command takes."""
    p.add_argument("spec", help="job spec YAML")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-6 rollout.n=4")


def load_spec_or_report(args: argparse.Namespace) -> Any | None:
    """The validated job spec of ``args.spec`` + ``args.overrides``; None after printing
    the problems (each ``field: what is wrong``) to stderr."""
    from services.config.job import JobSpecError, load_job
    from services.config.loader import is_override

    words = [args.spec, *args.overrides]  # overrides may come before the spec too
    files = [w for w in words if not is_override(w)]
    if len(files) != 1:
        print(f"expected one job spec file and a.b=c overrides, got {files or 'no file'}", file=sys.stderr)
        return None
    args.spec, args.overrides = files[0], [w for w in words if is_override(w)]
    try:
        return load_job(args.spec, args.overrides)
    except JobSpecError as exc:
        print(f"{args.spec}: {exc}", file=sys.stderr)
        return None


def check_inputs_or_report(spec: Any, spec_path: str) -> bool:
    """True when the model and data files of ``spec`` can be read and every registry name
    it uses exists; else print one line per problem to stderr and return False. A spec
    without problems may still get warnings on stderr (one line each: what it gives up)."""
    from services.config.names import name_problems
    from services.data.check import check_inputs

    from services.launch.supervision import resume_warnings

    problems = check_inputs(spec) + name_problems(spec)
    for line in problems:
        print(f"{spec_path}: {line}", file=sys.stderr)
    if not problems:
        for line in resume_warnings(spec):
            print(f"{spec_path}: warning: {line}", file=sys.stderr)
    return not problems
