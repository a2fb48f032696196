"""A stand-alone weight receiver that prints what it got: ``python -m rollout_svc.weights.probe``.

For debugging a deployment's weight channel, for the tests (real replica processes) and
for ``bench/weights.py``. Prints one JSON object per line on stdout:

    {"event": "welcome", "latest_version": .., "snapshot_version": ..}
    {"event": "update", "version": v, "bytes": n, "digest": {name: sha256-hex, ...}}
    {"event": "failed", "version": v, "error": "..."}
    {"event": "snapshot", "version": v, "bytes": n, "digest": {...}}

Digests are over each tensor's raw bytes (see ``tensor_digest``) so a test can check the
received weights bitwise. ``--die-at`` / ``--stop-at VERSION:BUCKET`` make the probe
SIGKILL / SIGSTOP itself once it has consumed that bucket (fault-injection for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rollout_svc.weights.probe", description=__doc__.splitlines()[0])
    p.add_argument("--address", required=True, help="publisher control address host:port")
    p.add_argument("--replica-id", required=True)
    p.add_argument("--until-version", type=int, required=True, help="exit after serving this version")
    p.add_argument("--snapshot-first", action="store_true", help="fetch and load the snapshot before waiting")
    p.add_argument("--catch-up", action="store_true", help="after a failed transfer, fetch the snapshot")
    p.add_argument("--no-digest", action="store_true", help="count bytes only (benchmarks)")
    p.add_argument("--receive-ahead", type=int, default=0, help="receive_ahead_buckets (0 = whole version)")
    p.add_argument("--timeout", type=float, default=30.0, help="transfer_timeout_s")
    p.add_argument("--die-at", default=None, help="VERSION:BUCKET: SIGKILL self after consuming that bucket")
    p.add_argument("--stop-at", default=None, help="VERSION:BUCKET: SIGSTOP self after consuming that bucket")
    return p.parse_args(argv)


def tensor_digest(t) -> str:  # noqa: ANN001 (torch imported lazily)
    """sha256 of the tensor's C-contiguous raw bytes, prefixed by dtype and shape."""
    import hashlib

    import torch

    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{str(t.dtype)}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from services.config.weights import WeightChannelConfig
    from services.weights import TransferError
    from rollout_svc.weights.receiver import WeightReceiver
    from services.weights.plan import TensorAssembler

    def at(spec: str | None) -> tuple[int, int] | None:
        if not spec:
            return None
        v, b = spec.split(":")
        return int(v), int(b)

    die, stop = at(args.die_at), at(args.stop_at)
    cfg = WeightChannelConfig(transfer_timeout_s=args.timeout, receive_ahead_buckets=args.receive_ahead)
    rx = WeightReceiver(cfg, args.replica_id, address=args.address).connect()
    _emit({"event": "welcome", "latest_version": rx.latest_version, "snapshot_version": rx.snapshot_version})

    def load_snapshot() -> None:
        snap = rx.fetch_snapshot()
        if snap is None:
            _emit({"event": "snapshot", "version": None})
            return
        digest = {} if args.no_digest else {n: tensor_digest(t) for n, t in snap.tensors()}
        nbytes = sum(t.numel() * t.element_size() for _, t in snap.tensors())
        if snap.version > rx.served_version:
            rx.report_loaded(snap.version)
        _emit({"event": "snapshot", "version": snap.version, "bytes": nbytes, "digest": digest})

    try:
        if args.snapshot_first:
            load_snapshot()
        while rx.served_version < args.until_version:
            update = rx.wait_for_update(timeout=1.0)
            if update is None:
                continue
            digest: dict[str, str] = {}
            nbytes = 0
            try:
                asm = TensorAssembler()
                for bucket in update.buckets():
                    for name, t in asm.feed(bucket):
                        nbytes += t.numel() * t.element_size()
                        if not args.no_digest:
                            digest[name] = tensor_digest(t)
                    if die == (update.version, bucket.index):
                        os.kill(os.getpid(), signal.SIGKILL)
                    if stop == (update.version, bucket.index):
                        os.kill(os.getpid(), signal.SIGSTOP)
            except TransferError as e:
                _emit({"event": "failed", "version": update.version, "error": str(e)})
                if args.catch_up:
                    load_snapshot()
                continue
            rx.report_loaded(update.version)
            _emit({"event": "update", "version": update.version, "bytes": nbytes, "digest": digest})
    finally:
        rx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
