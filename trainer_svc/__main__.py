"""``python -m trainer_svc --config FILE [a.b=c ...]``: run the trainer service.

FILE is a whole job spec (``services.config.job``; the trainer's view is cut out of it) or
a standalone :class:`services.config.trainer.TrainerServiceSpec` YAML. The command line
and the config are checked before torch is imported, so ``--help`` and config errors are
instant. The process then starts ``trainer.nproc`` ranks (``--nproc`` overrides) with a
TCPStore rendezvous on a free port, forwards SIGTERM to them (they checkpoint and exit),
and exits with the first failing rank's code. Rank 0 prints one line when ready::

    trainer ready metrics=<host:port> version=<v> step=<k>
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer_svc", description="meshrl trainer service (FSDP2)")
    p.add_argument("--config", required=True, help="job spec or standalone trainer spec (YAML/JSON)")
    p.add_argument("--nproc", type=int, default=None, help="ranks to start (default: trainer.nproc)")
    p.add_argument("--consumer", default=None, help="consumer name on the experience stream (default trainer-0)")
    p.add_argument("--log-level", default="INFO", help="logging level")
    p.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)  # set by the launcher
    p.add_argument("overrides", nargs="*", help="a.b=c overrides")
    return p.parse_args(argv)


def load_spec(path: str, overrides: list[str]):
    """The :class:`TrainerServiceSpec` in ``path`` (a job spec or a standalone trainer spec)."""
    import yaml
    from pydantic import ValidationError

    from services.config.job import JobSpecError, apply_overrides, format_validation_error, load_job
    from services.config.trainer import TrainerServiceSpec, trainer_spec_from_job

    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise JobSpecError(f"{path}: expected a mapping at the top level")
    if "name" in raw and "data" in raw:  # a whole job spec
        return trainer_spec_from_job(load_job(path, overrides))
    raw = apply_overrides(raw, overrides)
    try:
        return TrainerServiceSpec.model_validate(raw)
    except ValidationError as exc:
        raise JobSpecError(format_validation_error(exc).replace("job spec", "trainer spec")) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load_spec(args.config, args.overrides)
    except (OSError, ValueError) as exc:
        print(f"trainer: {exc}", file=sys.stderr)
        return 2
    if not args.as_rank:
        from trainer_svc.launch import spawn_ranks

        nproc = args.nproc or spec.trainer.nproc
        child = ["-m", "trainer_svc", "--config", args.config, "--as-rank", "--log-level", args.log_level]
        if args.consumer:
            child += ["--consumer", args.consumer]
        return spawn_ranks(child + list(args.overrides), nproc, threads=spec.trainer.torch_threads)
    from trainer_svc.main_rank import run_rank

    return run_rank(spec, consumer=args.consumer, log_level=args.log_level)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
