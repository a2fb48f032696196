"""The internal plane is closed: every RPC of the queue broker, the weight publisher and the
reward service refuses a call without the job's credential, or with a wrong one, with
UNAUTHENTICATED -- and the refused call changes nothing. (The rollout replica's RPCs are
checked the same way in test_rollout_vllm.py, which has a real engine at hand.)

Real servers on loopback; the test session's credential (tests/conftest.py) is the job's.
"""

from __future__ import annotations

import threading

import grpc
import pytest
import torch

from services import auth
from services.config.queues import EmbeddedQueueConfig
from services.config.weights import WeightChannelConfig
from services.pb import queue_pb2 as qpb
from services.pb import queue_pb2_grpc as qpb_grpc
from services.queues import RawItem, make_queue
from services.queues.broker_server import EmbeddedBroker

pytestmark = pytest.mark.timeout(120)

UNAUTH = grpc.StatusCode.UNAUTHENTICATED


def wrong_credentials() -> list[tuple[str, tuple]]:
    """(label, metadata): no credential, a wrong secret of the right length, the right secret
    under another scheme, and a wrong secret beside an unrelated header."""
    right = dict(auth.current().metadata())[auth.METADATA_KEY]
    secret = right.removeprefix("Bearer ")
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    return [
        ("none", ()),
        ("wrong", ((auth.METADATA_KEY, "Bearer " + flipped),)),
        ("scheme", ((auth.METADATA_KEY, "Basic " + secret),)),
        ("other", (("x-meshrl", secret), (auth.METADATA_KEY, "Bearer " + "x" * len(secret)))),
    ]


# ------------------------------------------------------------------------------------------------
# queue broker


async def _refused(call) -> None:  # noqa: ANN001 - an awaitable or an async-iterable call
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    assert ei.value.code() == UNAUTH, ei.value
    assert "credential" in ei.value.details()


async def test_broker_refuses_every_rpc_without_the_credential():
    broker = await EmbeddedBroker(port=0).start()
    cfg = EmbeddedQueueConfig(address=broker.address, op_timeout_s=5.0, lease_idle_s=0)
    q = make_queue(cfg, stream="s", group="g", consumer="c")
    try:
        await q.put_frames([RawItem(b"one", ("a",)), RawItem(b"two", ("b",))], stage="generated")
        leased = await q.get_frames(1, timeout=2.0)
        assert len(leased) == 1
        before = (broker.state.depth("s"), broker.state.stages(["a", "b", "z"]))
        assert before[0] == (2, 1, 1)
        lease_id = leased[0].id
        async with grpc.aio.insecure_channel(broker.address) as ch:
            stub = qpb_grpc.QueueServiceStub(ch)

            def put_messages():
                yield qpb.QueuePutMessage(batch=qpb.QueuePutBatch(stream="s", producer="intruder", max_depth=100))
                yield qpb.QueuePutMessage(item=qpb.QueuePutItem(seq=1, sample_ids=["z"], frame_bytes=3, inline=b"bad"))

            for label, md in wrong_credentials():
                await _refused(stub.Put(put_messages(), metadata=md, timeout=5))
                await _refused(stub.Get(qpb.QueueGetRequest(stream="s", group="g", consumer="x", max_items=5),
                                        metadata=md, timeout=5))
                await _refused(stub.Reclaim(qpb.QueueReclaimRequest(stream="s", group="g", consumer="x", max_items=5),
                                            metadata=md, timeout=5))
                await _refused(stub.Ack(qpb.QueueAckRequest(stream="s", group="g", entry_ids=[lease_id]),
                                        metadata=md, timeout=5))
                await _refused(stub.Depth(qpb.QueueDepthRequest(stream="s"), metadata=md, timeout=5))
                await _refused(stub.RecordStage(qpb.QueueRecordStageRequest(sample_ids=["a", "z"], stage="trained"),
                                                metadata=md, timeout=5))
                await _refused(stub.GetStages(qpb.QueueGetStagesRequest(sample_ids=["a"]), metadata=md, timeout=5))
                after = (broker.state.depth("s"), broker.state.stages(["a", "b", "z"]))
                assert after == before, label  # nothing enqueued, leased, acked or recorded

            # the same calls with the credential go through
            md = auth.current().metadata()
            assert (await stub.Depth(qpb.QueueDepthRequest(stream="s"), metadata=md, timeout=5)).depth == 2
        assert await q.ack(leased) == 1
        assert broker.state.depth("s") == (1, 1, 0)
    finally:
        await q.close()
        await broker.stop()


async def test_queue_client_with_a_wrong_credential_fails_clearly():
    broker = await EmbeddedBroker(port=0).start()
    cfg = EmbeddedQueueConfig(address=broker.address, op_timeout_s=5.0)
    q = make_queue(cfg, stream="s", group="g", consumer="c", credential=auth.JobCredential.generate())
    try:
        with pytest.raises(auth.CredentialError, match="refused this job credential"):
            await q.put_frames([RawItem(b"x", ("a",))])
        assert broker.state.depth("s") == (0, 0, 0)
    finally:
        await q.close()
        await broker.stop()


# ------------------------------------------------------------------------------------------------
# weight publisher


@pytest.mark.distributed
def test_weight_publisher_refuses_every_rpc_without_the_credential():
    from services.pb import weights_pb2 as pb
    from services.pb import weights_pb2_grpc as pb_grpc
    from trainer_svc.weights.publisher import WeightPublisher
    from rollout_svc.weights.receiver import WeightReceiver

    cfg = WeightChannelConfig(control_port=0, bucket_mb=0.001, transfer_timeout_s=10.0)
    pub = WeightPublisher(cfg).start()
    rx = None
    try:
        pub.publish(1, [("w", torch.ones(8))])
        rx = WeightReceiver(cfg, "r0", address=pub.control_address).connect()  # a real replica, with the credential
        assert pub.wait_for_replicas(1, timeout=10)
        before = pub._status()
        assert [r.replica_id for r in before.replicas] == ["r0"]
        with grpc.insecure_channel(pub.control_address) as ch:
            stub = pb_grpc.WeightServiceStub(ch)
            for label, md in wrong_credentials():
                calls = [
                    lambda: next(iter(stub.Subscribe(pb.SubscribeRequest(replica_id="intruder"), metadata=md, timeout=5))),
                    lambda: stub.Ack(pb.AckRequest(replica_id="r0", session=pub.session, status=pb.ACK_STATUS_LOADED,
                                                   policy_version=1), metadata=md, timeout=5),
                    lambda: next(iter(stub.FetchSnapshot(pb.SnapshotRequest(), metadata=md, timeout=5))),
                    lambda: stub.Status(pb.StatusRequest(), metadata=md, timeout=5),
                ]
                for call in calls:
                    with pytest.raises(grpc.RpcError) as ei:
                        call()
                    assert ei.value.code() == UNAUTH, (label, ei.value)
                assert pub._status() == before, label  # no new subscriber, r0's state untouched
            st = stub.Status(pb.StatusRequest(), metadata=auth.current().metadata(), timeout=5)
            assert st.latest_version == 1 and [r.replica_id for r in st.replicas] == ["r0"]
    finally:
        if rx is not None:
            rx.close()
        pub.close()


@pytest.mark.distributed
def test_weight_receiver_with_a_wrong_credential_never_subscribes():
    from services.weights import TransferError
    from trainer_svc.weights.publisher import WeightPublisher
    from rollout_svc.weights.receiver import WeightReceiver

    cfg = WeightChannelConfig(control_port=0, transfer_timeout_s=10.0, connect_timeout_s=2.0)
    pub = WeightPublisher(cfg).start()
    try:
        rx = WeightReceiver(cfg, "r0", address=pub.control_address, credential=auth.JobCredential.generate())
        with pytest.raises(TransferError):
            rx.connect(timeout=2.0)
        assert not pub.wait_for_replicas(1, timeout=0.5)
        ok = WeightReceiver(cfg, "r1", address=pub.control_address).connect()
        try:
            assert pub.wait_for_replicas(1, timeout=10)
        finally:
            ok.close()
    finally:
        pub.close()


# ------------------------------------------------------------------------------------------------
# reward service


def _samples(registry) -> dict:  # noqa: ANN001 - a prometheus CollectorRegistry
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect() for s in m.samples if not s.name.endswith("_created")}


async def test_reward_service_refuses_score_without_the_credential(tmp_path):
    from reward_svc.decode import load_decoder
    from reward_svc.server import RewardServer
    from services.config.reward import RewardConfig
    from services.pb import reward_pb2, reward_pb2_grpc
    from tests.unit.reward_common import write_tokenizer

    server = await RewardServer(RewardConfig(), load_decoder(write_tokenizer(tmp_path))).start()
    try:
        before = _samples(server.metrics.registry)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            stub = reward_pb2_grpc.RewardServiceStub(ch)
            for label, md in wrong_credentials():
                await _refused(stub.Score(reward_pb2.RewardScoreRequest(frame=b"MRLW-not-read"), metadata=md, timeout=10))
                assert _samples(server.metrics.registry) == before, label  # nothing scored or counted
        async with auth.aio_channel(f"127.0.0.1:{server.grpc_port}", auth.current()) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as ei:  # with the credential the frame is read (and refused)
                await reward_pb2_grpc.RewardServiceStub(ch).Score(reward_pb2.RewardScoreRequest(frame=b"MRLW-x"),
                                                                  timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop()


def test_a_thread_cannot_race_past_the_check():
    """The interceptor decides per call: concurrent good and bad calls get their own answers."""
    import asyncio

    async def main() -> list[bool]:
        broker = await EmbeddedBroker(port=0).start()
        try:
            async with grpc.aio.insecure_channel(broker.address) as ch:
                stub = qpb_grpc.QueueServiceStub(ch)
                good, bad = auth.current().metadata(), wrong_credentials()[1][1]

                async def one(md) -> bool:  # noqa: ANN001
                    try:
                        await stub.Depth(qpb.QueueDepthRequest(stream="s"), metadata=md, timeout=5)
                        return True
                    except grpc.aio.AioRpcError as exc:
                        assert exc.code() == UNAUTH
                        return False

                return await asyncio.gather(*(one(good if i % 2 else bad) for i in range(40)))
        finally:
            await broker.stop()

    out: list = []
    t = threading.Thread(target=lambda: out.extend(asyncio.run(main())))
    t.start()
    t.join(60)
    assert out == [bool(i % 2) for i in range(40)]


# ------------------------------------------------------------------------------------------------
# what cannot be authenticated listens only on the job's address


def _listening() -> set[tuple[str, int]]:
    import psutil

    return {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)  # gloo: IPv4-mapped IPv6 sockets
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


@pytest.mark.distributed
def test_rendezvous_store_and_gloo_ports_listen_on_the_job_address_only():
    from services.net import free_port, tcp_store
    from trainer_svc.weights.publisher import WeightPublisher
    from rollout_svc.weights.receiver import WeightReceiver

    before = _listening()
    store = tcp_store("127.0.0.1", free_port(), 10.0, is_master=True, world_size=None)
    client = tcp_store("127.0.0.1", store.port, 10.0, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"
    assert ("127.0.0.1", store.port) in _listening()

    cfg = WeightChannelConfig(host="127.0.0.1", control_port=0, bucket_mb=0.001, transfer_timeout_s=10.0)
    pub = WeightPublisher(cfg).start()
    rx = WeightReceiver(cfg, "r0", address=pub.control_address).connect()
    try:
        assert pub.wait_for_replicas(1, timeout=10)
        t = threading.Thread(target=lambda: pub.publish(1, [("w", torch.ones(64))]))
        t.start()
        update = rx.wait_for_update(timeout=15)
        assert update is not None and [n for n, _ in update.tensors()] == ["w"]
        t.join(30)
        opened = _listening() - before
        # control port, rendezvous store, gloo's data ports (both ends, in this process)
        assert len(opened) >= 4, opened
        assert {ip for ip, _ in opened} == {"127.0.0.1"}, opened
    finally:
        rx.close()
        pub.close()
