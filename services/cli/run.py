"""``meshrl run JOB.yaml [a.b=c ...]``: run one job on this machine (the local launcher).

Starts the controller (embedded broker, prompt feeder, job metrics), the trainer, the
reward workers and the rollout replicas as subprocesses, each with its own resolved config
under ``--run-dir``; shows a progress bar; stops everything on Ctrl-C or on the first
crashed service; leaves ``summary.json`` and plots beside the checkpoints.
"""

from __future__ import annotations

import argparse

from services.cli.common import add_spec_arguments, check_inputs_or_report, load_spec_or_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)
    p.add_argument("--run-dir", default=None, help="where configs, logs, checkpoints and plots go "
                   "(default: runs/<name>-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    spec = load_spec_or_report(args)
    if spec is None or not check_inputs_or_report(spec, args.spec):
        return 2
    run_dir = Path(args.run_dir or f"runs/{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from services.launch.controller import JobController

    print(f"meshrl run: job {spec.name!r}, run dir {run_dir}", flush=True)
    return JobController(spec, run_dir, progress=not args.no_progress).run()
