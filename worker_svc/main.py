"""``meshrl worker --role ROLE -- CMD``: a deployment's service container, running CMD for each job
the deployment's gateway hands out (``--launcher deployment``; see worker_svc/worker.py).

    meshrl worker --role trainer --ends-job -- python -m trainer_svc --config {spec}
"""

from __future__ import annotations

import argparse
import sys

from worker_svc.worker import add_worker_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_worker_arguments(p)


def run(args: argparse.Namespace) -> int:
    from worker_svc.worker import Worker

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("meshrl worker: give the service's command after --, e.g. -- python -m trainer_svc --config {spec}",
              file=sys.stderr)
        return 2
    worker = Worker(args.role, args.runs_dir, command, name=args.name, ends_job=args.ends_job,
                    grace_s=args.grace, state_file=args.state_file, scrape_s=args.scrape)
    print(f"meshrl worker {worker.name}: waiting for jobs in {args.runs_dir}", flush=True)
    return worker.run_forever()
