"""``python -m controller_svc JOB.yaml [a.b=c ...] [--run-dir DIR]``: the job controller of
``meshrl run`` as its own process (what the gateway's local launcher starts)."""

from __future__ import annotations

import sys

from controller_svc.main import add_arguments, run
from services.entrypoint import command_main


def main(argv: list[str] | None = None) -> int:
    return command_main("controller", "run one job: its controller and all its services", add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
