"""A stand-in for one service of a deployment job, for tests of what the gateway reads from
the deployment's workers (not of the services): ``python standin_service.py ROLE VIEW``.

It serves on its view's ``resources.metrics_port`` the counters the job ledger is made of
(the real names, as the real service exports them), adding one per tick until
``RUN_DIR/freeze`` exists; the reward stand-in records two samples as ``scored`` in the
job's real queue ledger (Redis, through the queue API); the trainer stand-in exits 0 once
``RUN_DIR/finish`` exists.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

COUNTERS = {
    "trainer": ("meshrl_trainer_samples_total", "meshrl_trainer_steps_total"),
    "rollout": ("meshrl_rollout_samples_total",),
    "reward": ("meshrl_reward_samples_total",),
    "feeder": ("meshrl_feeder_prompts_total",),
}


def main() -> int:
    role, view_path = sys.argv[1], sys.argv[2]
    view = yaml.safe_load(Path(view_path).read_text())
    run_dir = Path(os.environ["MESHRL_RUN_DIR"])
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = "".join(f"# TYPE {n[:-6]} counter\n{n} {count[0]}\n" for n in COUNTERS[role]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", int(view["resources"]["metrics_port"])), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if role == "reward":
        from services.config.queues import parse_queue_config
        from services.queues import make_queue

        async def record() -> None:
            q = make_queue(parse_queue_config(view["queues"]), stream="rollouts", group="reward", consumer="standin")
            try:
                await q.record_stage(["p0/0", "p0/1"], "scored")
            finally:
                await q.close()

        asyncio.run(record())
    print(f"standin {role} serving on {server.server_address}", flush=True)
    while True:
        if role == "trainer" and (run_dir / "finish").exists():
            return 0
        if not (run_dir / "freeze").exists():
            count[0] += 1
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
