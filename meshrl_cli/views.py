"""``meshrl views JOB.yaml --out DIR [a.b=c ...]``: write each service's view without running.

Writes ``DIR/trainer.yaml``, ``DIR/rollout.yaml``, ``DIR/reward.yaml`` and ``DIR/feeder.yaml``
(:mod:`services.config.views`): the whole config of each service, as ``meshrl run`` would
give it (without the run's own ports and directories). docker-compose and Kubernetes start
each service on its file: ``python -m trainer_svc --config DIR/trainer.yaml``.
"""

from __future__ import annotations

import argparse

from services.entrypoint import add_spec_arguments, load_spec_or_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)
    p.add_argument("--out", required=True, help="directory the view files are written to")


def run(args: argparse.Namespace) -> int:
    import sys

    from services.config.loader import ConfigError
    from services.config.views import derive_views, write_views

    spec = load_spec_or_report(args)
    if spec is None:
        return 2
    try:
        paths = write_views(derive_views(spec), args.out)
    except ConfigError as exc:
        print(f"{args.spec}: {exc}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
