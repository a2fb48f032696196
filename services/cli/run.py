"""``meshrl run JOB.yaml [a.b=c ...]``: run one job on this machine (the local launcher).

Starts the controller (embedded broker, prompt feeder, job metrics), the trainer, the
reward workers and the rollout replicas as subprocesses, each with its own resolved config
under ``--run-dir``; shows a progress bar; stops everything on Ctrl-C or on the first
crashed service; leaves ``summary.json`` and plots beside the checkpoints.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="job spec YAML")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.total_steps=10")
    p.add_argument("--run-dir", default=None, help="where configs, logs, checkpoints and plots go "
                   "(default: runs/<name>-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")


def run(args: argparse.Namespace) -> int:
    import sys
    import time
    from pathlib import Path

    from services.config.job import JobSpecError, load_job

    try:
        spec = load_job(args.spec, args.overrides)
    except JobSpecError as exc:
        print(f"{args.spec}: {exc}", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir or f"runs/{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from services.launch.controller import JobController

    print(f"meshrl run: job {spec.name!r}, run dir {run_dir}", flush=True)
    return JobController(spec, run_dir, progress=not args.no_progress).run()
