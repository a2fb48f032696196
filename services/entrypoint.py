"""The one command-line shape of meshrl's services, parsed before anything heavy is imported.

    python -m trainer_svc | rollout_svc | reward_svc | feeder_svc --config VIEW.yaml [--id ID] [--log-level L] [a.b=c ...]
    meshrl-trainer | meshrl-rollout | meshrl-reward | meshrl-feeder ...    (the same, as console scripts)
    python -m feeder_svc --config feeder.yaml [--state FILE] ...

and the shape of the processes that take a job spec or flags instead of a view
(``python -m controller_svc JOB.yaml``, ``python -m gateway_svc``, ``python -m worker_svc``,
each also a ``meshrl`` subcommand): a module with ``add_arguments(parser)`` and
``run(args) -> int``, started by :func:`run_command`, which turns a failure into one line.

``--config`` is the service's view (``meshrl views JOB.yaml --out DIR`` writes them;
``meshrl run`` writes them under ``<run_dir>/config/``). ``a.b=c`` overrides -- keys of the
view -- may appear anywhere on the line. ``--help`` is instant: no torch, no vLLM.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from services.config.loader import ConfigError, is_override

V = TypeVar("V")


def service_parser(service: str, description: str, default_id: str | None = None) -> argparse.ArgumentParser:
    """The parser every service starts from (add service-specific flags to it). Its usage
    line names the command that ran: the console script ``meshrl-<service>`` or ``python -m``."""
    script = f"meshrl-{service}"
    prog = script if Path(sys.argv[0]).name == script else f"python -m {service}_svc"
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", required=True, help=f"the {service} view YAML (`meshrl views JOB.yaml --out DIR`)")
    p.add_argument("--id", default=default_id,
                   help=f"this instance's name: consumer name on its stream, id in its readiness line (default {default_id})")
    p.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ...)")
    p.add_argument("overrides", nargs="*", help="a.b=c overrides of the view's keys (anywhere on the line)")
    return p


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv``, collecting ``a.b=c`` words wherever they appear into ``args.overrides``
    (verl users put them last, after the options; argparse alone stops at the first option)."""
    args, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    bad = [x for x in extra if not is_override(x) or not hasattr(args, "overrides")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (overrides are KEY=VALUE with a dotted KEY)")
    if hasattr(args, "overrides"):
        args.overrides = list(args.overrides or []) + extra
    return args


def load_view_or_exit(cls: type[V], args: argparse.Namespace, service: str) -> V:
    """The view of ``args.config`` + ``args.overrides``; on a bad file, print why and exit 2."""
    from services.config.views import load_view

    try:
        return load_view(cls, args.config, args.overrides)
    except (ConfigError, OSError) as exc:
        print(f"{service}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def pin_or_exit(cpus: str | None, key: str, service: str, *, vllm: bool = False) -> list[int]:
    """Pin this process to ``cpus`` (:func:`services.placement.pin`); on CPUs this machine
    does not give it, print why (naming ``key``) and exit 2."""
    from services.placement import pin

    try:
        return pin(cpus, key, vllm=vllm)
    except ValueError as exc:
        print(f"{service}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


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

    from services.supervision import resume_warnings

    problems = check_inputs(spec) + name_problems(spec)
    for line in problems:
        print(f"{spec_path}: {line}", file=sys.stderr)
    if not problems:
        for line in resume_warnings(spec):
            print(f"{spec_path}: warning: {line}", file=sys.stderr)
    return not problems


def run_command(prog: str, run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """``run(args)``, with every failure told as one line on stderr, ``<prog>: <what is
    wrong>`` (exit 2 for a problem of the input, 1 for anything else; :mod:`services.failures`).
    The traceback is shown only with ``args.debug`` or ``MESHRL_DEBUG=1``."""
    debug = bool(getattr(args, "debug", False)) or os.environ.get("MESHRL_DEBUG", "") not in ("", "0")
    try:
        return int(run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place failures become one line
        if debug:
            raise
        from services.failures import describe

        line, code = describe(exc)
        print(f"{prog}: {line}", file=sys.stderr)
        return code


def command_main(service: str, description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
                 run: Callable[[argparse.Namespace], int | None], argv: Sequence[str] | None = None) -> int:
    """A process's ``python -m <service>_svc`` (or ``meshrl-<service>``) entry: parse with
    :func:`parse_with_overrides`, then :func:`run_command`."""
    script = f"meshrl-{service}"
    prog = script if Path(sys.argv[0]).name == script else f"python -m {service}_svc"
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure (also MESHRL_DEBUG=1)")
    add_arguments(parser)
    return run_command(prog, run, parse_with_overrides(parser, argv))
