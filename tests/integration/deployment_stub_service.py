"""A small real service for the deployment-launcher tests (run by ``meshrl worker``).

    python deployment_stub_service.py --pids FILE [--serve] [--grow NAME] [--exit-code N]
                                      [--wait-lines FILE N] [--seconds S]

Appends its pid to ``--pids`` (one line per start). With ``--serve`` it serves ``/health``,
``/ready`` and ``/metrics`` on a wildcard address (as a container's service does) and announces
readiness with the ``MESHRL_READY`` line; ``--grow NAME`` makes counter ``NAME`` go up by
one every 0.2 s (progress), otherwise its counters stay at 0. Then: ``--exit-code N`` exits
at once with N; ``--wait-lines FILE N`` exits 0 once FILE has N lines (exit 1 after 90 s);
``--seconds S`` exits 0 after S seconds; otherwise it runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COUNTERS = ("meshrl_rollout_samples_total", "meshrl_reward_samples_total", "meshrl_trainer_samples_total")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pids", required=True)
    p.add_argument("--serve", action="store_true")
    p.add_argument("--grow", default=None)
    p.add_argument("--exit-code", type=int, default=None)
    p.add_argument("--wait-lines", nargs=2, default=None)
    p.add_argument("--seconds", type=float, default=None)
    args = p.parse_args()
    with open(args.pids, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    started = time.monotonic()

    if args.serve:
        from services.readiness import announce_ready

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path in ("/health", "/ready"):
                    body = b"ok\n"
                elif self.path == "/metrics":
                    grown = int((time.monotonic() - started) / 0.2)
                    body = "".join(f"# TYPE {n[:-6]} counter\n{n} {grown if n == args.grow else 0}\n"
                                   for n in COUNTERS).encode()
                else:
                    self.send_error(404)
                    return
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the prober gave up (this process was stopped meanwhile)
                    pass

            def log_message(self, *_: object) -> None:
                pass

        server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        announce_ready("stub", "stub", {"metrics": f"0.0.0.0:{server.server_address[1]}"})
    if args.exit_code is not None:
        print("scorer exploded", flush=True)
        return args.exit_code
    deadline = time.monotonic() + (args.seconds if args.seconds is not None else 90.0)
    while True:
        if args.wait_lines is not None:
            path, n = Path(args.wait_lines[0]), int(args.wait_lines[1])
            if path.exists() and len(path.read_text().split()) >= n:
                return 0
            if time.monotonic() > deadline:
                return 1
        elif args.seconds is not None and time.monotonic() > deadline:
            return 0
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
