"""A stand-in for ``python -m fleet_svc start SPEC --fleets-dir ROOT`` in the gateway's fleet
tests: the real fleet process (``fleet_svc.fleet.Fleet``: its state file with each replica's
phase and the scaling block, its supervision and restarts, its scaling policy reading the
jobs' ``load.json``, ``events.jsonl``, bounds asked for with ``FleetDir.request_bounds``, its
``/metrics``), whose replicas are a stand-in program instead of ``python -m rollout_svc`` (no
vLLM). The stand-in replica (``--replica``) does what the fleet and the gateway see of a
replica: it binds the metrics port of its view and answers ``/health``, ``/ready`` and
``/metrics``, prints the ``MESHRL_READY`` line, reports ``attached`` for every job in the
fleet's ``jobs/`` with the version in the job's ``load.json`` as ``served_version`` (a real
replica loads that version before it leases), ``detached`` when the job leaves or when it
stops, beats its own heartbeat (``members/<name>/_replica.json``: ``serving``, ``draining`` once
asked to stop, ``off`` as it exits) as rollout_svc/fleet_member.py does, and exits on SIGTERM.
Knobs (env):

    FAKE_FLEET_START_S   seconds a replica takes to announce ready (default 0.5)
    FAKE_FLEET_FAIL      the fleet exits at once with code 3 after a line on stderr
    FAKE_FLEET_STOP_S    seconds a replica takes to exit once asked (default 0)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script by the gateway
    sys.path.insert(0, str(ROOT))

from services.fleets import FleetDir  # noqa: E402


def fleet_main(argv: list[str]) -> int:
    """The fleet: ``fleet_svc.fleet.run_fleet`` with the stand-in replica program."""
    from fleet_svc.fleet import Fleet
    from services.config.fleet import FleetSpec
    from services.config.loader import load_model
    from services.procs import ServiceProcess, become_subreaper

    spec_path, root = Path(argv[0]), argv[argv.index("--fleets-dir") + 1]
    if os.environ.get("FAKE_FLEET_FAIL"):
        print("fake fleet: failing on purpose (FAKE_FLEET_FAIL)", file=sys.stderr, flush=True)
        return 3
    spec = load_model(FleetSpec, spec_path, what="fleet spec")
    fdir = FleetDir(spec.name, root)
    if fdir.running():
        print(f"fake fleet: fleet {spec.name!r} is already running", file=sys.stderr, flush=True)
        return 1

    class StandInFleet(Fleet):
        def _process(self, name: str, view: Path) -> ServiceProcess:
            argv = [sys.executable, str(Path(__file__).resolve()), "--replica", "--config", str(view), "--id", name,
                    "--fleet-dir", str(self.fdir.path)]  # fmt: skip
            return ServiceProcess(name, argv, self.fdir.log_file(name))

    os.umask(0o077)
    become_subreaper()
    fleet = StandInFleet(spec, fdir)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: fleet.stop())
    print(f"fake fleet {spec.name}: starting", flush=True)
    code = fleet.run()
    print(f"fake fleet {spec.name}: {'stopped' if code == 0 else 'failed'}", flush=True)
    return code


def replica_main(argv: list[str]) -> int:
    """One stand-in replica (see the module doc)."""
    from services.readiness import announce_ready

    view = yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text())
    name = argv[argv.index("--id") + 1]
    fdir_path = Path(argv[argv.index("--fleet-dir") + 1])
    fdir = FleetDir(fdir_path.name, fdir_path.parent)
    res = view.get("resources") or {}
    host, port = res.get("host", "127.0.0.1"), int(res.get("metrics_port") or 0)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if stop.wait(float(os.environ.get("FAKE_FLEET_START_S", "0.5"))):
        return 0

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = {"/health": b'{"status": "ok"}', "/ready": b'{"status": "ready"}',
                    "/metrics": b"meshrl_fake_replica_up 1\n"}.get(self.path.split("?")[0])  # fmt: skip
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    address = f"{host}:{http.server_address[1]}"
    announce_ready("rollout", name, {"metrics": address}, fleet=fdir.name)
    served: dict[str, int] = {}
    beat = getattr(fdir, "heartbeat", lambda *a, **k: None)  # the replica's own heartbeat (services/fleets.py)
    while not stop.wait(0.2):
        beat(name, "serving", jobs=sorted(served))
        jobs = set(fdir.attached())
        for job in sorted(jobs):
            try:
                version = int(json.loads(fdir.load_file(job).read_text()).get("version", 0))
            except (OSError, ValueError, TypeError):
                version = 0
            if served.get(job) != version:
                served[job] = version
                fdir.report(name, job, "attached", metrics=address, served_version=version)
        for job in set(served) - jobs:
            served.pop(job)
            fdir.report(name, job, "detached", detail="the job left the fleet")
    beat(name, "draining", jobs=sorted(served))
    time.sleep(float(os.environ.get("FAKE_FLEET_STOP_S", "0")))
    for job in served:
        fdir.report(name, job, "detached", detail="the replica is stopping")
    beat(name, "off")
    http.shutdown()
    print(f"fake replica {name}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(replica_main(args[1:]) if args[:1] == ["--replica"] else fleet_main(args))
