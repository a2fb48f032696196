"""Version ordering, bad input and snapshot edge cases of the weight channel.

Publisher and receiver run in this process (real gRPC on loopback, real gloo group over a
TCPStore); the multi-process scenarios are in test_weights_channel.py.
"""

from __future__ import annotations

import threading

import pytest
import torch

from services import auth
from services.config.weights import WeightChannelConfig
from services.weights import PlanError, TransferError, VersionError
from trainer_svc.weights.publisher import WeightPublisher
from rollout_svc.weights.receiver import WeightReceiver

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


def cfg(**kw) -> WeightChannelConfig:
    return WeightChannelConfig(**{"control_port": 0, "bucket_mb": 0.001, "transfer_timeout_s": 10.0, **kw})


def named(v: int):
    return [("w", torch.full((300,), float(v))), ("b", torch.arange(v + 1, dtype=torch.int64))]


def publish_and_take(pub: WeightPublisher, rx: WeightReceiver, version: int, tensors) -> tuple:
    """Publish in a thread while the receiver consumes; return (report, received, error)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("report", _publish(pub, version, tensors, out)))
    t.start()
    got, err = None, None
    update = rx.wait_for_update(timeout=15)
    if update is not None:
        try:
            got = [(n, x.clone()) for n, x in update.tensors()]
        except TransferError as e:
            err = e
    t.join(30)
    if "exc" in out:
        raise out["exc"]
    return out["report"], update, got, err


def _publish(pub, version, tensors, out):
    try:
        return pub.publish(version, tensors)
    except Exception as e:  # re-raised in the test thread
        out["exc"] = e
        return None


@pytest.fixture
def channel():
    pub = WeightPublisher(cfg()).start()
    rx = WeightReceiver(cfg(), "r0", address=pub.control_address).connect()
    assert pub.wait_for_replicas(1, timeout=10)
    yield pub, rx
    rx.close()
    pub.close()


def test_versions_go_forward_on_both_sides(channel):
    pub, rx = channel
    report, update, got, err = publish_and_take(pub, rx, 3, iter(named(3)))
    assert report.error is None and report.delivered == ["r0"] and err is None
    assert update.version == 3 and torch.equal(got[0][1], named(3)[0][1])
    rx.report_loaded(3)
    for bad in (3, 2, -1):
        with pytest.raises(VersionError):
            pub.publish(bad, iter(named(4)))
    with pytest.raises(VersionError, match="after already serving"):
        rx.report_loaded(2)
    assert pub.latest_version == 3
    report, update, got, err = publish_and_take(pub, rx, 5, iter(named(5)))
    assert report.error is None and update.version == 5 and torch.equal(got[1][1], named(5)[1][1])


def test_bad_tensor_aborts_the_transfer_and_loses_nothing(channel):
    pub, rx = channel
    dup = [("w", torch.zeros(300)), ("x", torch.zeros(300)), ("w", torch.zeros(3))]
    with pytest.raises(PlanError, match="twice"):
        publish_and_take(pub, rx, 1, iter(dup))
    assert pub.latest_version == -1  # not published
    with pytest.raises(PlanError, match="no tensors"):
        pub.publish(1, iter([]))
    def broken():
        yield "w", torch.zeros(300)
        yield "x", torch.zeros(300)
        raise RuntimeError("all-gather failed")

    with pytest.raises(RuntimeError, match="all-gather"):
        publish_and_take(pub, rx, 1, broken())
    assert pub.latest_version == -1
    # The receiver saw an aborted v1 (if it got that far) and is ready for the next epoch.
    report, update, got, err = publish_and_take(pub, rx, 1, iter(named(1)))
    assert report.error is None and update.version == 1 and err is None
    assert [n for n, _ in got] == ["w", "b"]


def test_snapshot_none_then_latest(channel):
    pub, rx = channel
    assert rx.fetch_snapshot() is None
    publish_and_take(pub, rx, 7, iter(named(7)))
    assert pub.wait_for_snapshot(7, timeout=10)
    assert rx.fetch_snapshot(min_version=8) is None
    snap = rx.fetch_snapshot(min_version=7)
    assert snap.version == 7
    assert {n: t for n, t in snap.tensors()}.keys() == {"w", "b"}
    assert torch.equal(dict(snap.tensors())["w"], named(7)[0][1])


def test_restarted_publisher_starts_a_new_version_line():
    """A trainer resumed from a checkpoint publishes versions below what the run that died
    had published. They come with a new session: the receiver takes them (and may report a
    lower version loaded), the new publisher does not mistake the old session's v5 for its
    own. Within one session versions still only go forward."""
    first = WeightPublisher(cfg()).start()
    port = first.control_port
    rx = WeightReceiver(cfg(connect_timeout_s=20), "r0", address=first.control_address).connect()
    try:
        assert first.wait_for_replicas(1, timeout=10)
        report, update, _, _ = publish_and_take(first, rx, 5, iter(named(5)))
        assert report.error is None and update.session == first.session == rx.session
        rx.report_loaded(5)
        first.close()
        second = WeightPublisher(cfg(control_port=port)).start()  # the trainer restarted
        try:
            assert second.session != first.session
            assert second.wait_for_replicas(1, timeout=20)  # the receiver re-subscribed
            assert second.replicas()["r0"].served_version == -1  # "v5" was another session's
            report, update, got, err = publish_and_take(second, rx, 4, iter(named(4)))
            assert report.error is None and err is None and report.delivered == ["r0"]
            assert update.version == 4 and update.session == second.session
            assert torch.equal(got[0][1], named(4)[0][1])
            rx.report_loaded(4)  # below v5, but v5 was the old session's
            assert second.wait_for_replicas(1, timeout=10, served_version=4)
            assert rx.served_version == 4 and rx.served_session == second.session
            with pytest.raises(VersionError, match="after already serving"):
                rx.report_loaded(3)
            with pytest.raises(VersionError):
                second.publish(4, iter(named(4)))
            report, update, got, err = publish_and_take(second, rx, 6, iter(named(6)))
            assert report.error is None and update.version == 6 and err is None
        finally:
            second.close()
    finally:
        rx.close()
        first.close()


#: A trainer's publisher in a process of its own, on fixed ports (as ``meshrl run`` gives the
#: trainer): publishes v1 and v2 to the first replica that subscribes, says so, then idles
#: until it is killed.
_PUBLISHER = """
import sys, torch
from services.config.weights import WeightChannelConfig
from trainer_svc.weights.publisher import WeightPublisher
cfg = WeightChannelConfig(control_port=int(sys.argv[1]), rendezvous_port=int(sys.argv[2]), bucket_mb=0.001,
                          transfer_timeout_s=10.0)
pub = WeightPublisher(cfg).start()
assert pub.wait_for_replicas(1, timeout=30)
for v in (1, 2):
    report = pub.publish(v, [("w", torch.full((300,), float(v))), ("b", torch.arange(v + 1))])
    assert report.error is None, report
print(pub.session, flush=True)
sys.stdin.read()
"""


def test_a_killed_publisher_restarted_on_the_same_ports_is_followed_at_once():
    """The trainer is SIGKILLed and comes back on the same control and rendezvous ports: the
    receiver's rendezvous client of the dead session must not be used again (its socket
    leads to the dead store), so the new session's first publish reaches the replica."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from services.net import free_port

    control, rendezvous = free_port(), free_port()
    root = Path(__file__).resolve().parents[2]
    first = subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(control), str(rendezvous)], cwd=root,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1"))
    rx = WeightReceiver(cfg(connect_timeout_s=30), "r0", address=f"127.0.0.1:{control}")
    second = None
    try:
        rx.connect(timeout=60)
        for v in (1, 2):  # the replica formed a group with the first session: it holds a store client
            update = rx.wait_for_update(timeout=30)
            assert update is not None and update.version == v
            assert torch.equal(dict(update.tensors())["w"], named(v)[0][1])
            rx.report_loaded(v)
        old_session = int(first.stdout.readline())
        assert old_session == rx.session
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        second = WeightPublisher(cfg(control_port=control, rendezvous_port=rendezvous)).start()
        assert second.rendezvous_port == rendezvous
        assert second.wait_for_replicas(1, timeout=30)  # the receiver re-subscribed
        report, update, got, err = publish_and_take(second, rx, 1, iter(named(1)))
        assert report.error is None and report.delivered == ["r0"], report
        assert err is None and update.session == second.session != old_session
        assert torch.equal(got[0][1], named(1)[0][1])
        report, update, got, err = publish_and_take(second, rx, 2, iter(named(2)))  # and the same epoch goes on
        assert report.error is None and report.delivered == ["r0"] and err is None, report
    finally:
        rx.close()
        if second is not None:
            second.close()
        if first.poll() is None:
            first.kill()
            first.wait(30)


def test_receiver_without_publisher_fails_fast():
    from services.net import free_port

    with pytest.raises(TransferError, match="no WELCOME"):
        WeightReceiver(cfg(), "lonely", address=f"127.0.0.1:{free_port()}").connect(timeout=1.0)


def test_status_rpc_and_metrics():
    import grpc
    from prometheus_client import CollectorRegistry

    from services.pb import weights_pb2 as pb
    from services.pb import weights_pb2_grpc as pb_grpc

    registry = CollectorRegistry()
    pub = WeightPublisher(cfg(), registry=registry).start()
    rx = WeightReceiver(cfg(), "r0", address=pub.control_address).connect()
    try:
        assert pub.wait_for_replicas(1, timeout=10)
        report, update, got, err = publish_and_take(pub, rx, 2, iter(named(2)))
        rx.report_loaded(2)
        assert pub.wait_for_replicas(1, timeout=10, served_version=2)
        with auth.channel(pub.control_address, auth.current()) as ch:
            st = pb_grpc.WeightServiceStub(ch).Status(pb.StatusRequest(), timeout=10)
            bad = pb.AckRequest(replica_id="r0", status=pb.ACK_STATUS_UNSPECIFIED)
            with pytest.raises(grpc.RpcError) as ei:
                pb_grpc.WeightServiceStub(ch).Ack(bad, timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert st.latest_version == 2 and st.snapshot_version == 2 and st.epoch == 1 and st.session == pub.session
        assert [(r.replica_id, r.served_version, r.received_version) for r in st.replicas] == [("r0", 2, 2)]
        assert registry.get_sample_value("meshrl_weights_published_version") == 2
        assert registry.get_sample_value("meshrl_weights_published_bytes_total") == report.tensor_bytes
        assert registry.get_sample_value("meshrl_weights_replica_served_version", {"replica": "r0"}) == 2
    finally:
        rx.close()
        pub.close()


def test_update_note_names_the_version_before_it_is_taken():
    """The "update" event fires once the version is pending: ``peek_update()`` names it
    (session, version) without taking it -- the rollout worker puts that in its note so the
    replica starts loading without asking first -- and it is gone once taken."""
    pub = WeightPublisher(cfg()).start()
    seen: list = []
    holder: dict = {}
    rx = WeightReceiver(cfg(), "r0", address=pub.control_address,
                        on_event=lambda kind: seen.append((kind, holder["rx"].peek_update())))
    holder["rx"] = rx
    try:
        rx.connect()
        assert pub.wait_for_replicas(1, timeout=10)
        assert rx.peek_update() is None
        report, update, got, err = publish_and_take(pub, rx, 4, iter(named(4)))
        assert report.error is None and err is None
        assert ("update", (rx.session, 4)) in seen and rx.session == pub.session
        assert rx.peek_update() is None  # taken
        assert update.received_at is not None and update.began_at <= update.received_at
        # LOADED sent in the background: checked now, delivered in order
        rx.report_loaded(4, wait=False)
        with pytest.raises(VersionError):
            rx.report_loaded(3, wait=False)
        assert pub.wait_for_replicas(1, timeout=10, served_version=4)
        report, update, got, err = publish_and_take(pub, rx, 6, iter(named(6)))
        rx.report_loaded(6, wait=False)
        assert pub.wait_for_replicas(1, timeout=10, served_version=6)
    finally:
        rx.close()
        pub.close()
