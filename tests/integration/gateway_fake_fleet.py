"""A stand-in for ``python -m fleet_svc start SPEC --fleets-dir ROOT`` in the gateway's fleet
tests: it keeps the fleet directory protocol (services/fleets.py) as the real fleet does --
the directory created, ``starting``, then ``ready`` with its replicas, until a stop request or
SIGTERM, then ``stopped`` -- but starts no replica (no vLLM). Knobs (env):

    FAKE_FLEET_START_S   seconds between starting and ready (default 0.5)
    FAKE_FLEET_FAIL      exit at once with code 3 after a line on stderr
    FAKE_FLEET_STOP_S    seconds it takes to stop once asked (default 0)
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import yaml

from services.fleets import FleetDir


def main(argv: list[str]) -> int:
    spec_path, root = Path(argv[0]), argv[argv.index("--fleets-dir") + 1]
    if os.environ.get("FAKE_FLEET_FAIL"):
        print("fake fleet: failing on purpose (FAKE_FLEET_FAIL)", file=sys.stderr, flush=True)
        return 3
    spec = yaml.safe_load(spec_path.read_text())
    fdir = FleetDir(spec["name"], root)
    if fdir.running():
        print(f"fake fleet: fleet {spec['name']!r} is already running", file=sys.stderr, flush=True)
        return 1
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    fdir.create(spec_path.read_text())
    names = [f"rollout-{i}" for i in range(int(spec.get("replicas", 1)))]
    extra = {"model": spec["model"]["path"], "max_jobs": spec.get("max_jobs", 4), "max_lora_rank": 8}
    fdir.write_state("starting", names, members={}, **extra)
    print(f"fake fleet {spec['name']}: starting", flush=True)
    deadline = time.monotonic() + float(os.environ.get("FAKE_FLEET_START_S", "0.5"))
    while time.monotonic() < deadline and not stop and not fdir.stop_requested():
        time.sleep(0.05)
    members = {n: {"alive": True, "ready": True, "restarts": 0, "metrics": f"http://127.0.0.1:1{i:04d}",
                   "pid": os.getpid()} for i, n in enumerate(names)}
    if not stop and not fdir.stop_requested():
        fdir.write_state("ready", names, members=members, **extra)
        print(f"fake fleet {spec['name']}: ready", flush=True)
    while not stop and not fdir.stop_requested():
        time.sleep(0.05)
    time.sleep(float(os.environ.get("FAKE_FLEET_STOP_S", "0")))
    fdir.write_state("stopped", names, members={n: {**m, "alive": False} for n, m in members.items()}, **extra)
    print(f"fake fleet {spec['name']}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
