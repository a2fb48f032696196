"""Weight channel end to end: a real publisher (gRPC + gloo over a TCPStore) and real
receiver processes (``python -m rollout_svc.weights.probe``) on loopback.

Covers: bitwise-identical delivery to two replica processes over several versions; a
replica SIGKILLed mid-broadcast (the publisher fails that transfer without waiting a full
deadline, the survivor keeps receiving, the restarted replica catches up via snapshot);
a replica hung (SIGSTOP) mid-broadcast costs at most one deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from services.config.weights import WeightChannelConfig
from trainer_svc.weights.publisher import WeightPublisher
from rollout_svc.weights.probe import tensor_digest

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
BUCKET_MB = 0.03125  # 32 KiB buckets: ~10 per version


def weights(version: int) -> list[tuple[str, torch.Tensor]]:
    """Deterministic per-version weights: mixed dtypes, one tensor bigger than a bucket, an empty one."""
    g = torch.Generator().manual_seed(version)
    out = [
        ("embed.weight", torch.randn(200, 128, generator=g)),  # 100 KiB > one bucket
        ("norm.weight", torch.randn(128, generator=g).to(torch.bfloat16)),
        ("empty", torch.empty(0, 3)),
        ("step", torch.tensor(version, dtype=torch.int64)),
    ]
    out += [(f"layers.{i}.w", torch.randn(64, 96, generator=g)) for i in range(8)]  # 24 KiB each
    out += [("mask", torch.rand(77, generator=g) > 0.5), ("half", torch.randn(33, generator=g).half())]
    return out


def digests(version: int) -> dict[str, str]:
    return {n: tensor_digest(t) for n, t in weights(version)}


class Probe:
    """A receiver subprocess; its JSON events are collected by a reader thread."""

    def __init__(self, address: str, replica_id: str, until: int, *extra: str, timeout: float = 20.0):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "rollout_svc.weights.probe", "--address", address, "--replica-id", replica_id,
               "--until-version", str(until), "--timeout", str(timeout), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            with self._cond:
                self.events.append(json.loads(line))
                self._cond.notify_all()

    def wait_event(self, pred, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._t.is_alive()):
                    raise AssertionError(f"event not seen; exit={self.proc.poll()} events={self.events}")
                self._cond.wait(min(left, 0.5))

    def updates(self) -> dict[int, dict]:
        with self._cond:
            return {e["version"]: e for e in self.events if e["event"] == "update"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def publisher(tmp_path):
    cfg = WeightChannelConfig(control_port=0, bucket_mb=BUCKET_MB, transfer_timeout_s=20.0,
                              zero_copy_min_mb=BUCKET_MB / 2, snapshot_dir=str(tmp_path / "snap"))
    pub = WeightPublisher(cfg).start()
    probes: list[Probe] = []
    yield pub, probes
    for p in probes:
        p.stop()
    pub.close()


def test_two_replicas_bitwise_then_kill_and_catch_up(publisher):
    pub, probes = publisher
    a = Probe(pub.control_address, "replica-a", 6, "--receive-ahead", "1")
    b = Probe(pub.control_address, "replica-b", 3, "--receive-ahead", "1", "--die-at", "3:2")
    probes += [a, b]
    assert pub.wait_for_replicas(2, timeout=60)

    for v in (1, 2):  # v2 as the FSDP2 trainer publishes: borrowed, big tensors zero-copy
        report = pub.publish(v, iter(weights(v)), borrow=v == 2)
        assert report.error is None and sorted(report.delivered) == ["replica-a", "replica-b"]
        assert report.num_buckets >= 8 and report.num_tensors == len(weights(v))
    for p in (a, b):
        p.wait_event(lambda e: e.get("event") == "update" and e["version"] == 2)
        ups = p.updates()
        assert ups[1]["digest"] == digests(1) and ups[2]["digest"] == digests(2)
    assert pub.wait_for_replicas(2, timeout=30, served_version=2)

    # v3: replica-b SIGKILLs itself after consuming bucket 2 of 10+.
    report = pub.publish(3, iter(weights(3)))
    assert report.error is not None and "replica-b" in report.failed
    # Never blocked on the dead replica: its death breaks its connections and the transfer
    # fails on that (gloo's read error, or a member gone before it acknowledged), not on
    # the deadline (`transfer_timeout_s` ran out: "did not complete within").
    assert "did not complete within" not in report.error, report
    assert b.proc.wait(30) == -signal.SIGKILL

    # The survivor keeps receiving; the dead replica is left out of the next epoch.
    for v in (4, 5):  # v5 borrowed: the snapshot below then serves the caller's tensors by reference
        report = pub.publish(v, iter(weights(v)), borrow=v == 5)
        assert report.error is None and report.delivered == ["replica-a"], report
    a.wait_event(lambda e: e.get("event") == "update" and e["version"] == 5)
    assert a.updates()[4]["digest"] == digests(4) and a.updates()[5]["digest"] == digests(5)

    # replica-b restarts and catches up from the snapshot, then receives v6 by broadcast.
    assert pub.wait_for_snapshot(5, timeout=30)
    b2 = Probe(pub.control_address, "replica-b", 6, "--snapshot-first")
    probes.append(b2)
    snap = b2.wait_event(lambda e: e.get("event") == "snapshot")
    assert snap["version"] == 5 and snap["digest"] == digests(5)
    assert pub.wait_for_replicas(2, timeout=30, served_version=5)
    report = pub.publish(6, iter(weights(6)))
    assert report.error is None and sorted(report.delivered) == ["replica-a", "replica-b"]
    for p in (a, b2):
        assert p.wait_event(lambda e: e.get("event") == "update" and e["version"] == 6)["digest"] == digests(6)
        assert p.proc.wait(30) == 0
    status = pub.replicas()
    assert status == {} or all(s.served_version == 6 for s in status.values())
    pub.close()  # persists the last snapshot into snapshot_dir
    from safetensors.torch import load_file

    saved = load_file(str(Path(pub.cfg.snapshot_dir) / "weights-v6.safetensors"))
    assert {n: tensor_digest(t) for n, t in saved.items()} == digests(6)


def test_hung_replica_costs_one_deadline(tmp_path):
    cfg = WeightChannelConfig(control_port=0, bucket_mb=BUCKET_MB, transfer_timeout_s=3.0, snapshot=False)
    with WeightPublisher(cfg) as pub:
        # the survivor's own deadline is longer than the publisher's: the one deadline that runs
        # out is the publisher's (a survivor giving up first would abort the transfer itself)
        a = Probe(pub.control_address, "replica-a", 3, "--receive-ahead", "1", timeout=20.0)
        b = Probe(pub.control_address, "replica-b", 3, "--receive-ahead", "1", "--timeout", "3", "--stop-at", "1:1")
        try:
            assert pub.wait_for_replicas(2, timeout=60)
            report = pub.publish(1, iter(weights(1)))  # replica-b freezes after bucket 1
            assert report.error is not None and "replica-b" in report.failed, report
            # The frozen replica still holds its connections: the transfer fails on the
            # deadline, once (nothing else failed it first).
            assert report.error.endswith(f"broadcast did not complete within {cfg.transfer_timeout_s:g}s"), report
            # Still frozen and still subscribed, yet it is not waited for again: it never
            # acknowledged the failed transfer, so it is not ready.
            assert b.proc.poll() is None
            for v in (2, 3):
                report = pub.publish(v, iter(weights(v)))
                # not a member of these epochs: had it been waited for, frozen, the transfer
                # would have failed on the deadline with it in `failed`
                assert report.delivered == ["replica-a"] and report.failed == [] and report.error is None, report
            assert a.wait_event(lambda e: e.get("event") == "update" and e["version"] == 3)["digest"] == digests(3)
        finally:
            a.stop()
            b.stop()
