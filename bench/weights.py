"""Benchmark: the weight channel vs raw TCP, publishing ~1 GB of float32 to 2 receivers.

Both are measured in this run, against the same two receiver processes, on the same
tensors (``--gb`` GiB as ``--tensor-mb`` MiB float32 tensors):

* weights: ``WeightPublisher.publish(v, tensors, borrow=True)`` (how the FSDP2 trainer
  publishes its fresh ``full_tensor()`` results; ``--copy`` for ``borrow=False``) -- bucket
  packing (zero-copy for tensors of at least ``zero_copy_min_mb``), the gRPC plan
  messages and the gloo broadcast over a TCPStore-rendezvoused group -- until both
  receivers iterated every bucket and reported the version loaded;
* tcp: the same bytes written with ``socket.sendall`` straight from the tensors to each
  receiver over its own loopback TCP connection (one sender thread per receiver,
  concurrently), until both received everything into a reused buffer and acknowledged.

Both sides reuse their memory across rounds (the publisher its bucket arena, the receivers
``reuse_buffers``), so neither pays first-touch page faults after the first round.

Each round runs tcp then weights; the first round (cold memory on both sides) is dropped
and the median of the other rounds counts for each method (the machine this runs on is
shared and noisy; the best-of ratio is printed too). The last line is
``weights ratio_vs_tcp=<R> seconds_per_gb=<S>`` with R = tcp seconds / weights seconds
(1.0 = as fast as raw TCP) and S = weights seconds per GiB.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=1.0, help="GiB of float32 weights per version (default 1)")
    p.add_argument("--tensor-mb", type=float, default=16.0, help="size of each tensor in MiB (default 16)")
    p.add_argument("--bucket-mb", type=float, default=64.0, help="weight channel bucket size in MiB (default 64)")
    p.add_argument("--receivers", type=int, default=2, help="receiver processes (default 2)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; the median of each method counts (default 7)")
    p.add_argument("--timeout", type=float, default=120.0, help="transfer deadline in seconds")
    p.add_argument("--pipeline-depth", type=int, default=None,
                   help="broadcasts in flight per side (default: the config's)")
    p.add_argument("--gloo-devices", type=int, default=None,
                   help="gloo devices per data group (default: the config's; 1 = the pre-2026-11-22 behaviour)")
    p.add_argument("--copy", action="store_true",
                   help="publish with borrow=False (every byte packed into the publisher's buffers)")
    p.add_argument("--role", choices=["main", "receiver"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--tcp-port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--address", default="", help=argparse.SUPPRESS)
    p.add_argument("--replica-id", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def channel_overrides(args: argparse.Namespace) -> dict:
    """WeightChannelConfig fields both sides take from the command line."""
    extra = {"transfer_timeout_s": args.timeout}
    if args.pipeline_depth is not None:
        extra["pipeline_depth"] = args.pipeline_depth
    if args.gloo_devices is not None:  # the publisher decides; receivers take it from JOIN
        extra["gloo_devices"] = args.gloo_devices
    return extra


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], min(len(view) - got, 16 << 20))
        if n == 0:
            raise ConnectionError("sender closed the connection")
        got += n


def receiver(args: argparse.Namespace) -> int:
    """One receiver process: per round, a raw TCP payload then one weight version."""
    import torch

    torch.set_num_threads(1)
    from services.config.weights import WeightChannelConfig
    from rollout_svc.weights.receiver import WeightReceiver

    sock = socket.create_connection(("127.0.0.1", args.tcp_port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # reuse_buffers: bucket memory is recycled as the consumer moves on (what a vLLM replica
    # that copies each tensor into its parameters would use); the TCP side reuses its buffer too.
    rx = WeightReceiver(WeightChannelConfig(reuse_buffers=True, **channel_overrides(args)), args.replica_id,
                        address=args.address).connect()
    buf = None
    sock.sendall(b"R")  # subscribed
    try:
        for rnd in range(args.rounds):
            head = bytearray(8)
            _recv_exact(sock, memoryview(head))
            (total,) = struct.unpack("<Q", head)
            if buf is None or buf.numel() != total:
                buf = torch.empty(total, dtype=torch.uint8)
            _recv_exact(sock, memoryview(buf.numpy()))
            sock.sendall(b"A")
            update = None
            while update is None:
                update = rx.wait_for_update(timeout=args.timeout)
            n = sum(b.nbytes for b in update.buckets())
            rx.report_loaded(update.version)
            del update
            if n <= 0:
                raise RuntimeError("empty update")
        sock.recv(1)  # stay subscribed until the publisher has seen the last report
    finally:
        rx.close()
        sock.close()
    return 0


def main() -> int:
    args = parse_args()
    if args.role == "receiver":
        return receiver(args)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from services.config.weights import WeightChannelConfig
    from trainer_svc.weights.publisher import WeightPublisher

    numel = int(args.tensor_mb * (1 << 20)) // 4
    count = max(1, round(args.gb * 1024 / args.tensor_mb))
    tensors = [(f"layers.{i}.weight", torch.randn(numel)) for i in range(count)]
    total = count * numel * 4
    gib = total / (1 << 30)
    print(f"payload: {count} float32 tensors of {args.tensor_mb:g} MiB = {gib:.3f} GiB, "
          f"{args.receivers} receivers, bucket {args.bucket_mb:g} MiB, {args.rounds} rounds", flush=True)

    cfg = WeightChannelConfig(control_port=0, bucket_mb=args.bucket_mb, **channel_overrides(args))
    pub = WeightPublisher(cfg).start()
    srv = socket.create_server(("127.0.0.1", 0))
    procs = []
    conns: list[socket.socket] = []
    try:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        for i in range(args.receivers):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "receiver", "--tcp-port",
                   str(srv.getsockname()[1]), "--address", pub.control_address, "--replica-id", f"bench-{i}",
                   "--rounds", str(args.rounds), "--timeout", str(args.timeout)]
            if args.pipeline_depth is not None:
                cmd += ["--pipeline-depth", str(args.pipeline_depth)]
            procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT))
        srv.settimeout(args.timeout)
        for _ in procs:
            c, _addr = srv.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c.settimeout(args.timeout)
            conns.append(c)
        for c in conns:
            if c.recv(1) != b"R":
                raise RuntimeError("a receiver did not subscribe")
        if not pub.wait_for_replicas(args.receivers, timeout=args.timeout):
            raise RuntimeError("receivers did not subscribe to the weight channel")
        views = [memoryview(t.numpy()).cast("B") for _, t in tensors]

        def send_all(c: socket.socket) -> None:
            c.sendall(struct.pack("<Q", total))
            for v in views:
                c.sendall(v)

        tcp_s, w_s = [], []
        for rnd in range(args.rounds):
            t0 = time.perf_counter()
            threads = [threading.Thread(target=send_all, args=(c,)) for c in conns]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for c in conns:
                if c.recv(1) != b"A":
                    raise RuntimeError("a receiver did not acknowledge the TCP payload")
            tcp_s.append(time.perf_counter() - t0)

            version = rnd + 1
            t0 = time.perf_counter()
            # borrow=True: the trainer's FSDP2 path (full_tensor() results are fresh tensors).
            report = pub.publish(version, iter(tensors), borrow=not args.copy)
            if not pub.wait_for_replicas(args.receivers, timeout=args.timeout, served_version=version):
                raise RuntimeError(f"receivers did not load v{version}")
            w_s.append(time.perf_counter() - t0)
            if report.error:
                raise RuntimeError(f"publish failed: {report.error}")
            print(f"round {rnd}: tcp {tcp_s[-1]:.3f}s ({gib / tcp_s[-1]:.2f} GiB/s per receiver)  "
                  f"weights {w_s[-1]:.3f}s ({gib / w_s[-1]:.2f} GiB/s, {report.num_buckets} buckets)", flush=True)
            pub.wait_for_snapshot(version, timeout=args.timeout)  # not timed: off the critical path
        for c in conns:
            c.sendall(b"Q")
        for p in procs:
            if p.wait(args.timeout) != 0:
                raise RuntimeError(f"receiver exited with {p.returncode}")
    finally:
        for c in conns:
            c.close()
        srv.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        pub.close()
    warm_tcp, warm_w = (tcp_s[1:], w_s[1:]) if len(tcp_s) > 1 else (tcp_s, w_s)
    med_tcp, med_w = statistics.median(warm_tcp), statistics.median(warm_w)
    print(f"best of rounds: tcp {min(warm_tcp):.3f}s weights {min(warm_w):.3f}s "
          f"ratio {min(warm_tcp) / min(warm_w):.3f}; median: tcp {med_tcp:.3f}s weights {med_w:.3f}s")
    print(f"weights ratio_vs_tcp={med_tcp / med_w:.3f} seconds_per_gb={med_w / gib:.3f}")
    return 0


if __name__ == "__main__":
    from services import auth

    auth.provision_temporary()  # this run is a job of its own: its servers and clients share one credential
    sys.exit(main())
