"""A real gateway in a process of its own, for the tests that kill it (SIGKILL) and start it
again on the same runs dir:

    python tests/integration/gateway_process.py RUNS_DIR ADDRESSES_FILE

REST and gRPC on free loopback ports, the stand-in job driver, the stand-in fleet program
(gateway_fake_fleet.py: the real fleet process with stand-in replicas) for its fleets; the
test's token. Once serving it writes ``{"http", "grpc", "pid"}`` to ADDRESSES_FILE (whole).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway_svc.server import Gateway, GatewaySettings  # noqa: E402
from tests.integration.gateway_support import FAKE_FLEET, STANDIN_MODEL, TOKEN, fake_launcher  # noqa: E402


def main(argv: list[str]) -> int:
    runs, out = Path(argv[0]), Path(argv[1])
    settings = GatewaySettings(token=TOKEN, host="127.0.0.1", port=0, grpc_port=0, runs_dir=runs, poll_interval=0.1,
                               cancel_timeout=2.0, input_roots=[Path(STANDIN_MODEL).parent])  # fmt: skip
    gw = Gateway(settings, launcher=fake_launcher())
    gw.fleets.command = [sys.executable, str(FAKE_FLEET)]
    gw.start()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"http": gw.http_url, "grpc": gw.grpc_address, "pid": os.getpid()}))
    os.replace(tmp, out)
    gw.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
