"""``python -m fleet_svc start|status|stop ...``: the same as ``meshrl fleet ...``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from fleet_svc.main import add_arguments, run
    from services.entrypoint import command_main

    return command_main("fleet", "meshrl's fleet of warm rollout replicas (docs/fleet.md)", add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
