"""``python -m worker_svc --role ROLE -- CMD``: a deployment's service container (``meshrl worker``)."""

from __future__ import annotations

import sys

from services.entrypoint import command_main
from worker_svc.main import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    return command_main("worker", "run a service for each job the deployment's gateway hands out",
                        add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
