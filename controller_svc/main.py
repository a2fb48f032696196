"""``meshrl run JOB.yaml [a.b=c ...] [--launcher ray]``: run one job, its services on this
machine (the local launcher) or each in its own Ray actor on a Ray cluster (docs/ray.md).

Starts the controller (embedded broker, prompt feeder, job metrics), the trainer, the
reward workers and the rollout replicas as subprocesses, each with its own resolved config
under ``--run-dir``; shows a progress bar; restarts a crashed or silent service with the
job's ``services.restart`` policy (docs/supervision.md) and stops everything on Ctrl-C, when
a service exhausts its budget or when the job stalls past its deadline; leaves
``summary.json`` and plots beside the checkpoints.
"""

from __future__ import annotations

import argparse

from services.entrypoint import add_spec_arguments, check_inputs_or_report, load_spec_or_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_spec_arguments(p)
    p.add_argument("--run-dir", default=None, help="where configs, logs, checkpoints and plots go "
                   "(default: runs/<name>-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    p.add_argument("--launcher", choices=["local", "ray"], default=None,
                   help="where the services run: local child processes, or one Ray actor per service on the Ray "
                   "cluster at services.ray.address / $RAY_ADDRESS (same as services.launcher=...; docs/ray.md)")
    p.add_argument("--weak-sandbox", action="store_true",
                   help="where bubblewrap cannot run, run user code (reward functions, tools) in the weaker process "
                   "sandbox instead of refusing it (no filesystem or uid isolation; docs/security.md)")


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import os

    # the run dir, its credential, checkpoints and logs: this user's only, whatever the umask
    os.umask(0o077)
    if getattr(args, "weak_sandbox", False):
        from services.sandbox.confine import WEAK_ENV

        os.environ[WEAK_ENV] = "1"  # the job's services inherit it
    if getattr(args, "launcher", None):
        args.overrides = [*args.overrides, f"services.launcher={args.launcher}"]
    spec = load_spec_or_report(args)
    if spec is None or not check_inputs_or_report(spec, args.spec):
        return 2
    run_dir = Path(args.run_dir or f"runs/{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    from controller_svc.controller import JobController

    print(f"meshrl run: job {spec.name!r}, run dir {run_dir}", flush=True)
    return JobController(spec, run_dir, progress=not args.no_progress).run()
