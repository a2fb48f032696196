"""The weight channel in canary mode: a candidate reaches the canaries only, a promoted
version every replica, a rejected one never a promoted-only subscriber (the live-policy
endpoint); rollbacks and late joiners load the right snapshot.

Publisher and receivers run in this process (real gRPC on loopback, real gloo groups over
a TCPStore).
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch

from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.pb import weights_pb2_grpc as pb_grpc
from trainer_svc.weights.publisher import WeightPublisher
from rollout_svc.weights.receiver import WeightReceiver
from services.weights.errors import VersionError

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def cfg(**kw) -> WeightChannelConfig:
    return WeightChannelConfig(**{"control_port": 0, "bucket_mb": 0.001, "transfer_timeout_s": 10.0,
                                  "rollout": {"mode": "canary"}, **kw})


def named(v: int):
    return [("w", torch.full((300,), float(v))), ("b", torch.arange(v + 1, dtype=torch.int64))]


def publish(pub: WeightPublisher, v: int, **kw) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("report", pub.publish(v, iter(named(v)), **kw)))
    t.start()
    return t, out


def until(pred, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def snapshot_w(rx: WeightReceiver) -> tuple[int, float]:
    snap = rx.fetch_snapshot()
    return snap.version, float(dict(snap.named_tensors)["w"][0])


@pytest.fixture
def mesh():
    """A canary-mode publisher, two replicas and a promoted-only subscriber ("serve")."""
    pub = WeightPublisher(cfg()).start()
    rxs = {name: WeightReceiver(cfg(), name, address=pub.control_address, promoted_only=name == "serve").connect()
           for name in ("rollout-0", "rollout-1", "serve")}
    assert pub.wait_for_replicas(3, timeout=10)
    yield pub, rxs
    for rx in rxs.values():
        rx.close()
    pub.close()


def test_candidates_reach_the_canary_only_and_promotions_everyone(mesh):
    pub, rxs = mesh
    t, out = publish(pub, 0, promote=True)  # the trainer's starting weights: promoted at once
    t.join(10)
    assert out["report"].route == "promote" and out["report"].delivered == []
    until(lambda: all(rx.target is not None for rx in rxs.values()), "every replica told its version")
    canary = next(n for n, rx in rxs.items() if rx.target[1])
    other = ({"rollout-0", "rollout-1"} - {canary}).pop()
    assert canary != "serve" and rxs["serve"].target == (0, False) and rxs[other].target == (0, False)
    assert {n: snapshot_w(rx) for n, rx in rxs.items()} == {n: (0, 0.0) for n in rxs}

    t, out = publish(pub, 1)
    update = rxs[canary].wait_for_update(timeout=10)
    assert update is not None and update.version == 1
    got = dict((n, x.clone()) for n, x in update.tensors())
    t.join(10)
    assert out["report"].route == "canaries" and out["report"].delivered == [canary]
    assert float(got["w"][0]) == 1.0 and rxs[canary].target == (1, True)
    assert not rxs[canary].target_from_snapshot  # it was seated before the broadcast: it gets it
    assert rxs[other].wait_for_update(timeout=0.5) is None and rxs["serve"].wait_for_update(timeout=0.1) is None
    assert snapshot_w(rxs[canary]) == (1, 1.0) and snapshot_w(rxs[other]) == (0, 0.0)

    t, out = publish(pub, 2)  # a candidate is under test: held back, sent to nobody
    t.join(10)
    assert out["report"].route == "held_back" and rxs[canary].wait_for_update(timeout=0.5) is None

    pub.promote(1, {"logprob_gap": 0.01})
    until(lambda: rxs[other].target == (1, False) and rxs["serve"].target == (1, False), "SERVE of v1")
    assert snapshot_w(rxs[other]) == (1, 1.0) and snapshot_w(rxs["serve"]) == (1, 1.0)
    rxs[canary].report_loaded(1)

    t, out = publish(pub, 3)
    update = rxs[canary].wait_for_update(timeout=10)
    list(update.tensors())
    t.join(10)
    rxs[canary].report_loaded(3)
    pub.reject(3, "logprob_gap 0.4 vs promoted 0.02", {"logprob_gap": 0.4})
    until(lambda: rxs[canary].target == (1, True), "the canary told to roll back")
    assert snapshot_w(rxs[canary]) == (1, 1.0), "the canary rolls back from the promoted snapshot"
    rxs[canary].report_loaded(1)  # going back is allowed when the publisher says so
    until(lambda: pub.replicas()[canary].served_version == 1, "the publisher sees the rollback")
    assert rxs["serve"].target == (1, False) and snapshot_w(rxs["serve"]) == (1, 1.0)

    st = pub._status()
    assert (st.rollout_mode, st.promoted_version, st.candidate_version, st.paused) == ("canary", 1, -1, "")
    assert [(e.policy_version, e.kind) for e in st.events] == [(0, "promoted"), (1, "candidate"), (1, "promoted"),
                                                               (3, "candidate"), (3, "rejected")]
    assert st.events[-1].measurements["logprob_gap"] == pytest.approx(0.4)
    assert {r.replica_id: (r.canary, r.target_version) for r in st.replicas} == {
        canary: (True, 1), other: (False, 1), "serve": (False, 1)}

    # a rollback that finishes after the next candidate was named: its report is still a rollback
    t, out = publish(pub, 4)
    list(rxs[canary].wait_for_update(timeout=10).tensors())
    t.join(10)
    rxs[canary].report_loaded(4)
    pub.reject(4, "logprob_gap 0.5 vs promoted 0.02")
    until(lambda: rxs[canary].target == (1, True), "the canary told to roll back again")
    t, out = publish(pub, 5)  # the next candidate, named before the canary finished rolling back
    until(lambda: rxs[canary].target == (5, True), "the canary told of v5")
    rxs[canary].report_loaded(1)
    until(lambda: pub.replicas()[canary].served_version == 1, "the publisher sees the late rollback")
    list(rxs[canary].wait_for_update(timeout=10).tensors())
    t.join(10)
    rxs[canary].report_loaded(5)
    with pytest.raises(VersionError, match="after already serving"):
        rxs[canary].report_loaded(1)  # that rollback is over: going back now is refused


def test_a_canary_seated_after_its_candidates_broadcast_is_told_to_load_the_snapshot(mesh):
    """The canary dies with a candidate under test: the replica that takes its seat must not
    wait for a broadcast that went to the dead one (it used to, until transfer_timeout_s)."""
    pub, rxs = mesh
    t, _ = publish(pub, 0, promote=True)
    t.join(10)
    until(lambda: any(rx.target and rx.target[1] for rx in rxs.values()), "a canary seated")
    canary = next(n for n, rx in rxs.items() if rx.target and rx.target[1])
    other = ({"rollout-0", "rollout-1"} - {canary}).pop()
    t, out = publish(pub, 1)
    list(rxs[canary].wait_for_update(timeout=10).tensors())
    t.join(10)
    assert out["report"].delivered == [canary] and rxs[other].target == (0, False)
    rxs[canary].close()  # killed
    until(lambda: rxs[other].target == (1, True), "the other replica seated as the canary")
    assert rxs[other].target_from_snapshot, "told the broadcast went out without it"
    assert snapshot_w(rxs[other]) == (1, 1.0)
    rxs[other].report_loaded(1)
    until(lambda: pub.replicas()[other].served_version == 1, "the publisher sees the new canary on v1")
    assert rxs["serve"].target == (0, False), "the candidate never reaches the promoted-only subscriber"
    # the next candidate is broadcast to the new canary as usual
    pub.promote(1, {"logprob_gap": 0.01})
    t, out = publish(pub, 2)
    list(rxs[other].wait_for_update(timeout=10).tensors())
    t.join(10)
    assert out["report"].delivered == [other]
    until(lambda: rxs[other].target == (2, True), "the new canary told of v2")
    assert not rxs[other].target_from_snapshot


def test_a_late_joiner_gets_the_promoted_snapshot_and_a_paused_rollout_resumes_over_grpc(mesh):
    pub, rxs = mesh
    t, _ = publish(pub, 0, promote=True)
    t.join(10)
    until(lambda: any(rx.target and rx.target[1] for rx in rxs.values()), "a canary seated")
    canary = next(n for n, rx in rxs.items() if rx.target and rx.target[1])
    t, _ = publish(pub, 1)
    list(rxs[canary].wait_for_update(timeout=10).tensors())
    t.join(10)
    pub.reject(1, "error rate", pause=True)
    t, out = publish(pub, 2)
    t.join(10)
    assert out["report"].route == "held_back" and pub._status().paused.startswith("v1 rejected")
    late = WeightReceiver(cfg(), "rollout-9", address=pub.control_address).connect()
    try:
        until(lambda: late.target == (0, False), "the late joiner told the promoted version")
        assert snapshot_w(late) == (0, 0.0)
    finally:
        late.close()
    with grpc.insecure_channel(pub.control_address) as ch:  # a call without the job credential is refused
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.WeightServiceStub(ch).Resume(pb.ResumeRequest(reason="x"), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    from services import auth

    with auth.channel(pub.control_address, pub.credential) as ch:
        stub = pb_grpc.WeightServiceStub(ch)
        reply = stub.Resume(pb.ResumeRequest(reason="fixed"), timeout=5)
        assert reply.paused == "" and reply.events[-1].kind == "resumed"
        with pytest.raises(grpc.RpcError) as err:
            stub.Resume(pb.ResumeRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    t, out = publish(pub, 3)
    list(rxs[canary].wait_for_update(timeout=10).tensors())
    t.join(10)
    assert out["report"].route == "canaries"
