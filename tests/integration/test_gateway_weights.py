"""The gateway shows a job's weight plane (status.json ``weights``): per replica the version it
serves and its role (canary / promoted), the promoted and candidate versions and the canary
gate's decisions -- over REST and gRPC, and as job events. A real gateway on loopback runs
the stand-in driver (``FAKE_WEIGHTS=1``: v0 and v1 promoted, v2 rejected at the canary);
the dashboard's view of the same is checked in test_dashboard_chromium.py."""

from __future__ import annotations

import math

import grpc
import httpx
import pytest

from gateway_svc.launchers.local import clean_weights
from services.pb import job_pb2, job_pb2_grpc
from tests.integration.gateway_support import TOKEN, VALID_SPEC, auth, fake_launcher, running_gateway, wait_until

pytestmark = pytest.mark.timeout(120)


def test_rest_and_grpc_show_each_replicas_version_and_role_and_the_gates_decisions(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=4, FAKE_INTERVAL=0.1, FAKE_WEIGHTS=1)
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
        jid = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        wait_until(lambda: c.get(f"/v1/jobs/{jid}", headers=auth()).json()["state"] == "succeeded", what="the job's end")
        w = c.get(f"/v1/jobs/{jid}", headers=auth()).json()["progress"]["weights"]
        assert (w["mode"], w["promoted"], w["candidate"]) == ("canary", 1, None)
        assert w["replicas"] == {"rollout-0": {"served_version": 1, "role": "canary"},
                                 "rollout-1": {"served_version": 1, "role": "promoted"}}
        assert [(e["version"], e["kind"]) for e in w["events"]] == [
            (0, "promoted"), (1, "candidate"), (1, "promoted"), (2, "candidate"), (2, "rejected")]
        assert w["events"][-1]["measurements"]["logprob_gap"] == 0.37
        # the decisions are job events, each once however often the gateway polled
        events = [(e["kind"], e["detail"]) for e in c.get(f"/v1/jobs/{jid}/events", headers=auth()).json()["events"]]
        decided = [e for e in events if e[0].startswith(("version_", "rollout_"))]
        assert [k for k, _ in decided] == ["version_promoted", "version_promoted", "version_rejected"], events
        assert decided[2][1].startswith("v2: logprob_gap 0.3700 vs promoted 0.0010") and "logprob_gap=0.37" in decided[2][1]
        # the curves' points do not carry it
        points = c.get(f"/v1/jobs/{jid}/metrics", headers=auth()).json()["points"]
        assert points and all(p.get("weights") is None for p in points)

        with grpc.insecure_channel(gw.grpc_address) as channel:
            stub = job_pb2_grpc.JobServiceStub(channel)
            got = stub.GetJob(job_pb2.JobIdRequest(id=jid), metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=10)
        gw_msg = got.progress.weights
        assert got.progress.HasField("weights") and gw_msg.mode == "canary" and gw_msg.promoted == 1
        assert not gw_msg.HasField("candidate") and gw_msg.paused == ""
        assert {n: (r.served_version, r.role) for n, r in gw_msg.replicas.items()} == {
            "rollout-0": (1, "canary"), "rollout-1": (1, "promoted")}
        assert [(e.version, e.kind) for e in gw_msg.events][-1] == (2, "rejected")
        assert gw_msg.events[-1].measurements["logprob_gap"] == pytest.approx(0.37)


def test_a_malformed_weights_block_is_cleaned_never_passed_on():
    assert clean_weights({"mode": "sideways"}) == {} and clean_weights([1]) == {}
    got = clean_weights({
        "mode": "canary", "promoted": math.nan, "candidate": 2.5, "paused": 7,
        "replicas": {"r0": {"role": "boss", "served_version": 1}, "r1": {"role": "canary", "served_version": -3},
                     "r2": "x"},
        "events": [{"kind": "exploded", "version": 1}, {"kind": "rejected", "version": True},
                   {"kind": "promoted", "version": 3.0, "ts": math.inf, "reason": 5,
                    "measurements": {"logprob_gap": math.nan, "samples": 8, "flag": True}}],
    })  # fmt: skip
    assert got == {"mode": "canary", "replicas": {"r1": {"role": "canary"}},
                   "events": [{"ts": 0.0, "version": 3, "kind": "promoted", "reason": "", "measurements": {"samples": 8.0}}]}
