"""The one command-line shape of meshrl's services, parsed before anything heavy is imported.

    python -m trainer_svc | rollout_svc | reward_svc | feeder_svc --config VIEW.yaml [--id ID] [--log-level L] [a.b=c ...]
    meshrl-trainer | meshrl-rollout | meshrl-reward | meshrl-feeder ...    (the same, as console scripts)
    python -m feeder_svc --config feeder.yaml [--state FILE] ...

``--config`` is the service's view (``meshrl views JOB.yaml --out DIR`` writes them;
``meshrl run`` writes them under ``<run_dir>/config/``). ``a.b=c`` overrides -- keys of the
view -- may appear anywhere on the line. ``--help`` is instant: no torch, no vLLM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

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
