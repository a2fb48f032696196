"""``meshrl credential PATH``: write a new job credential (mode 0600) for a deployment's secret.

    meshrl credential ./job.credential     # then: a compose secret / kubectl create secret ... --from-file

``meshrl run`` makes its own per job; this is for services started apart (compose, Kubernetes,
one service by hand with ``MESHRL_JOB_CREDENTIAL_FILE``). The secret is never printed.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="file to write (replaced if it exists); readable by this user only")


def run(args: argparse.Namespace) -> int:
    from services.auth import JobCredential

    path = JobCredential.generate().write(args.path)
    print(f"wrote a new job credential to {path} (mode 0600)")
    return 0
