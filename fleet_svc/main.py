"""``meshrl fleet start FLEET.yaml [a.b=c ...]``, ``meshrl fleet status [NAME]``,
``meshrl fleet stop NAME``, ``meshrl fleet scale NAME --min A --max B``: a local operator's
fleet of warm rollout replicas (docs/fleet.md).

``start`` runs the fleet in the foreground (Ctrl-C or ``meshrl fleet stop`` stops it);
``status`` prints a fleet's state, its replicas and the jobs attached to it; ``stop`` asks
a running fleet to stop and waits for it; ``scale`` sets a running fleet's replica bounds
(its scaling policy then adds or drains replicas to stay within them). Fleets live under ``--fleets-dir``
(``$MESHRL_FLEETS_DIR``, else ``~/.meshrl/fleets``): a job attaches to the fleet of that
name there (``services.rollout.fleet: NAME``).
"""

from __future__ import annotations

import argparse
import json
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="{start,status,stop,scale}")
    start = sub.add_parser("start", help="run a fleet in the foreground until Ctrl-C or `meshrl fleet stop`")
    start.add_argument("spec", help="the fleet's YAML spec (name, model, rollout, replicas, max_jobs)")
    start.add_argument("overrides", nargs="*", help="a.b=c overrides of the spec's keys")
    status = sub.add_parser("status", help="a fleet's state, replicas and attached jobs (all fleets without NAME)")
    status.add_argument("name", nargs="?", help="the fleet's name")
    status.add_argument("--json", action="store_true", help="print the state as JSON")
    stop = sub.add_parser("stop", help="stop a running fleet and wait until it stopped")
    stop.add_argument("name", help="the fleet's name")
    stop.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")
    scale = sub.add_parser("scale", help="set a running fleet's replica bounds (within its spec's max_replicas)")
    scale.add_argument("name", help="the fleet's name")
    scale.add_argument("--min", type=int, default=None, help="fewest replicas (default: unchanged)")
    scale.add_argument("--max", type=int, default=None, help="most replicas (default: unchanged)")
    scale.add_argument("--replicas", type=int, default=None, help="exactly this many (min = max)")
    for q in (start, status, stop, scale):
        q.add_argument("--fleets-dir", default=None, help="where fleets keep their directories "
                       "(default $MESHRL_FLEETS_DIR, else ~/.meshrl/fleets)")


def run(args: argparse.Namespace) -> int:
    return {"start": _start, "status": _status, "stop": _stop, "scale": _scale}[args.action](args)


def _start(args: argparse.Namespace) -> int:
    from services.config.fleet import FleetSpec
    from services.config.loader import load_model
    from services.fleets import FleetDir

    spec = load_model(FleetSpec, args.spec, args.overrides, what="fleet spec")
    from fleet_svc.fleet import run_fleet

    return run_fleet(spec, FleetDir(spec.name, args.fleets_dir))


def _status(args: argparse.Namespace) -> int:
    from services.fleets import FleetDir, fleets_root

    root = fleets_root(args.fleets_dir)
    names = [args.name] if args.name else sorted(p.name for p in root.glob("*") if (p / "fleet.json").exists())
    states = {}
    for name in names:
        fdir = FleetDir(name, root)
        st = fdir.state()
        if st is None:
            if args.name:
                raise LookupError(f"no fleet {name!r} under {root}")
            continue
        if st.get("state") in ("starting", "ready") and not fdir.running():
            st["state"] = "dead"  # its process is gone without saying so
        st["attached"] = {job: fdir.reports(job) for job in fdir.attached()}
        states[name] = st
    if args.json:
        print(json.dumps(states if not args.name else states[args.name], indent=2))
        return 0
    if not states:
        print(f"no fleets under {root}")
    for name, st in states.items():
        print(f"fleet {name}: {st['state']}  model={st.get('model')}  max_jobs={st.get('max_jobs')}  "
              f"max_lora_rank={st.get('max_lora_rank')}" + (f"  ({st['detail']})" if st.get("detail") else ""))
        sc = st.get("scaling") or {}
        if sc:
            sig = sc.get("signals") or {}
            print(f"  scaling: {sc.get('desired')} replica(s) of {sc.get('min')}..{sc.get('max')}  backlog="
                  f"{sig.get('backlog', 0):g} ({sig.get('backlog_per_replica', 0):g}/replica)  "
                  f"trainer_wait={sig.get('trainer_wait', 0):.0%}")
        for rep, m in (st.get("members") or {}).items():
            if m.get("phase") == "off" and not m.get("alive"):
                continue
            print(f"  {rep}: {m.get('phase') or ('alive' if m.get('alive') else 'down')} "
                  f"restarts={m.get('restarts', 0)} metrics={m.get('metrics')}")
        for job, reports in st["attached"].items():
            line = ", ".join(f"{rep}={r.get('state')}" + (f"@v{r['served_version']}" if r.get("served_version") is
                                                          not None else "") for rep, r in reports.items())
            print(f"  job {job}: {line or 'waiting for the replicas'}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    from services.fleets import FleetDir

    fdir = FleetDir(args.name, args.fleets_dir)
    if fdir.state() is None:
        raise LookupError(f"no fleet {args.name!r} under {fdir.path.parent}")
    if not fdir.running():
        print(f"meshrl fleet: fleet {args.name!r} is not running")
        return 0
    fdir.request_stop()
    deadline = time.monotonic() + args.timeout
    while fdir.running():
        if time.monotonic() > deadline:
            raise TimeoutError(f"fleet {args.name!r} did not stop within {args.timeout:g}s (pid "
                               f"{fdir.state().get('pid')})")
        time.sleep(0.5)
    print(f"meshrl fleet: fleet {args.name!r} stopped")
    return 0


def _scale(args: argparse.Namespace) -> int:
    from services.config.fleet import FleetSpec
    from services.config.loader import load_model
    from services.fleets import FleetDir

    fdir = FleetDir(args.name, args.fleets_dir)
    if not fdir.running():
        raise LookupError(f"fleet {args.name!r} is not running under {fdir.path.parent}")
    spec = load_model(FleetSpec, fdir.spec_file, what="fleet spec")
    sc = (fdir.state() or {}).get("scaling") or {}
    lo = args.replicas if args.replicas is not None else args.min if args.min is not None else sc.get("min", 1)
    hi = args.replicas if args.replicas is not None else args.max if args.max is not None else sc.get("max", lo)
    most = len(spec.replica_names())
    if not 1 <= lo <= hi <= most:
        raise ValueError(f"meshrl fleet scale: need 1 <= min ({lo}) <= max ({hi}) <= {most} (the fleet's "
                         f"scaling.max_replicas)")
    fdir.request_bounds(lo, hi)
    print(f"meshrl fleet: fleet {args.name!r} now runs {lo}..{hi} replica(s)")
    return 0
