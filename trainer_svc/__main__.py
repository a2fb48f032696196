"""``python -m trainer_svc --config trainer.yaml [--id ID] [a.b=c ...]``: run the trainer service.

The file is the trainer's view of a job (:class:`services.config.views.TrainerView`; written by
``meshrl run`` or ``meshrl views``). The command line and the view are checked before
torch is imported, so ``--help`` and config errors are instant. The process then starts
``resources.nproc`` ranks with a TCPStore rendezvous on a free port, forwards SIGTERM to
them (they checkpoint and exit), and exits with the first failing rank's code. Rank 0
announces readiness with the one ``MESHRL_READY {...}`` line (``services.readiness``):
addresses ``metrics`` (and ``weights`` when publishing), ``world_size``, ``device``,
``dtype``, ``version``, ``step``.
"""

from __future__ import annotations

import os
import sys


def parse_args(argv: list[str] | None = None):
    from services.entrypoint import parse_with_overrides, service_parser

    p = service_parser("trainer", "meshrl trainer service (FSDP2)", default_id="trainer-0")
    p.add_argument("--as-rank", action="store_true", help="==SUPPRESS==")  # set by the rank launcher
    return parse_with_overrides(p, argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer_svc`` and the ``meshrl-trainer`` console script."""
    from services.config.views import TrainerView
    from services.entrypoint import load_view_or_exit, pin_or_exit

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the ranks inherit it
    args = parse_args(argv)
    spec = load_view_or_exit(TrainerView, args, "trainer")
    if not args.as_rank:
        pin_or_exit(spec.resources.cpus, "services.trainer.cpus", "trainer")  # the ranks inherit it
        from trainer_svc.launch import spawn_ranks

        child = ["-m", "trainer_svc", "--config", args.config, "--as-rank", "--log-level", args.log_level,
                 "--id", args.id]
        return spawn_ranks(child + list(args.overrides), spec.resources.nproc, threads=spec.resources.torch_threads)
    from trainer_svc.launch import die_with_launcher
    from trainer_svc.main_rank import run_rank

    die_with_launcher()
    return run_rank(spec, consumer=args.id, log_level=args.log_level)


if __name__ == "__main__":
    sys.exit(main())
