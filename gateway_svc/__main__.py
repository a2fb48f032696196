"""``python -m gateway_svc [--host H] [--port P] ...``: the gateway (``meshrl gateway``)."""

from __future__ import annotations

import sys

from gateway_svc.main import add_arguments, run
from services.entrypoint import command_main


def main(argv: list[str] | None = None) -> int:
    return command_main("gateway", "serve the REST + gRPC control plane and the dashboard",
                        add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
