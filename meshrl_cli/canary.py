"""``meshrl canary RUN_DIR``: the canary gate of a running job -- and resuming it.

    meshrl canary runs/job1              # promoted / candidate versions, roles, the timeline
    meshrl canary runs/job1 --json       # the same as JSON
    meshrl canary runs/job1 --resume     # after a rejection with weights.rollout.on_reject=pause

Asks the trainer's weight publisher (``WeightService.Status`` / ``Resume``) at the address
of the job's rollout view (``<run_dir>/config/rollout-0.yaml``), with the job's credential
(``<run_dir>/job.credential``), as every service of the job does.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="the job's run directory (config/rollout-0.yaml and job.credential are read there)")
    p.add_argument("--resume", action="store_true",
                   help="resume a rollout paused after a rejection: the trainer trains on; its next version is "
                        "the next candidate")
    p.add_argument("--reason", default="resumed by an operator", help="logged with --resume")
    p.add_argument("--json", action="store_true", help="print the publisher's status as JSON")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the publisher (default 10)")


def status_dict(reply) -> dict:
    """The publisher's ``StatusReply`` as plain data."""
    return {
        "mode": reply.rollout_mode, "latest": reply.latest_version, "promoted": reply.promoted_version,
        "candidate": None if reply.candidate_version < 0 else reply.candidate_version, "paused": reply.paused,
        "replicas": {r.replica_id: {"served": r.served_version, "canary": r.canary, "target": r.target_version}
                     for r in reply.replicas},
        "events": [{"ts": e.ts, "version": e.policy_version, "kind": e.kind, "reason": e.reason,
                    "measurements": dict(e.measurements)} for e in reply.events],
    }


def run(args: argparse.Namespace) -> int:
    import grpc
    import yaml

    from services import auth
    from services.config.views import RolloutView
    from services.pb import weights_pb2 as pb
    from services.pb import weights_pb2_grpc as pb_grpc

    run_dir = Path(args.run_dir)
    view_path = run_dir / "config" / "rollout-0.yaml"
    if not view_path.is_file():
        raise FileNotFoundError(f"{view_path}: no rollout view (is {run_dir} a meshrl run directory?)")
    weights = RolloutView.model_validate(yaml.safe_load(view_path.read_text())).weights
    if weights is None:
        raise ValueError(f"{view_path}: the job has no weight channel")
    credential = auth.JobCredential.load(run_dir / auth.FILE_NAME)
    with auth.channel(f"{weights.host}:{weights.control_port}", credential) as channel:
        stub = pb_grpc.WeightServiceStub(channel)
        try:
            if args.resume:
                reply = stub.Resume(pb.ResumeRequest(reason=args.reason), timeout=args.timeout)
            else:
                reply = stub.Status(pb.StatusRequest(), timeout=args.timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise ValueError(f"nothing to resume: {exc.details()}") from None
            raise ConnectionError(f"the trainer's weight publisher at {weights.host}:{weights.control_port} did not "
                                  f"answer: {exc.code().name} (is the job running?)") from None
    st = status_dict(reply)
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    if args.resume:
        print("resumed: the trainer trains on; its next version is the next candidate")
    print(f"mode {st['mode']}: promoted v{st['promoted']}, candidate "
          f"{'none' if st['candidate'] is None else 'v%d' % st['candidate']}, latest v{st['latest']}"
          + (f"; PAUSED ({st['paused']})" if st["paused"] else ""))
    for rid, r in sorted(st["replicas"].items()):
        print(f"  {rid}: serves v{r['served']} ({'canary' if r['canary'] else 'promoted'})")
    for e in st["events"]:
        when = time.strftime("%H:%M:%S", time.localtime(e["ts"]))
        print(f"  {when} v{e['version']} {e['kind']}" + (f": {e['reason']}" if e["reason"] else ""))
    return 0
