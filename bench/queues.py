"""Queue throughput: DataProto frames producer process -> consumer process, per backend,
against a raw TCP socket between the same two processes in the same run.

    python bench/queues.py [--big-mb 64 --big-n 6 --small-n 64 --msgs 40000]

Phases (one producer process, one consumer process, run one after the other):
  * tcp:      length-prefixed frames over one loopback socket (recv_into a buffer, decode);
  * redis:    a private redis-server started here (no persistence), put -> get -> decode -> ack;
  * embedded: a broker process started here (in memory), put -> get -> decode -> ack.
Each for 1 MB and 64 MB frames (encode on the producer and decode on the consumer are in
every phase, TCP included). Throughput = bytes / (last decode - first send), clocks from
CLOCK_MONOTONIC shared by both processes. Then 1 KB frames pipelined through redis
(batched puts and gets of 500, acked; transport only: frames encoded once up front, not
decoded) for messages per second. The last line:
    queues redis_ratio_vs_tcp=<R> embedded_ratio_vs_tcp=<E> redis_msgs_per_s_1kb=<M>
with R and E the 64 MB-frame throughput ratios against TCP.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--big-mb", type=int, default=64, help="size of the large frames (MB)")
    p.add_argument("--big-n", type=int, default=6, help="large frames per phase")
    p.add_argument("--small-n", type=int, default=64, help="1 MB frames per phase")
    p.add_argument("--msgs", type=int, default=40_000, help="1 KB messages through redis")
    return p.parse_args()


def make_frame(nbytes: int, tag: str):
    """A DataProto of 4 rows whose float32 tensor ``x`` totals ~``nbytes``; sample ids ``tag-r``."""
    import numpy as np
    import torch

    from services.protocol import DataProto

    cols = max(1, nbytes // 16)
    return DataProto.from_dict(tensors={"x": torch.ones(4, cols, dtype=torch.float32)},
                               non_tensors={"sample_id": np.array([f"{tag}-{r}" for r in range(4)], dtype=object)})


def _queue_cfg(kind: str, addr: str, frame_bytes: int):
    """Backpressure bound: about 256 MB of frames in flight (at least 4)."""
    from services.config.queues import EmbeddedQueueConfig, RedisQueueConfig

    depth = max(4, (256 << 20) // max(frame_bytes, 1))
    common = {"max_depth": depth, "op_timeout_s": 60.0, "lease_idle_s": 0, "max_frame_bytes": 1 << 30}
    if kind == "redis":
        return RedisQueueConfig(url=addr, **common)
    return EmbeddedQueueConfig(address=addr, chunk_bytes=4 << 20, **common)


# ---------------------------------------------------------------------------- producer side
def producer_main(ctl, plan: list[dict]) -> None:
    import asyncio
    import socket
    import time

    import torch

    from services import wire
    from services.queues import RawItem, make_queue

    torch.set_num_threads(1)
    _warm_up()
    for phase in plan:
        port = ctl.recv()  # consumer ready (for tcp: its listening port)
        size, n, kind, tag = phase["size"], phase["n"], phase["kind"], phase["tag"]
        frames = [make_frame(size, f"{tag}{i}") for i in range(n)] if kind != "msgs" else []
        t0 = time.monotonic()
        if kind == "tcp":
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for f in frames:
                    buf = wire.encode(f)
                    s.sendall(len(buf).to_bytes(8, "little"))
                    s.sendall(buf)
                s.recv(1)
        elif kind == "msgs":
            async def put_msgs() -> float:
                q = make_queue(_queue_cfg("redis", phase["addr"], 1024), stream=tag, group="bench",
                               consumer="producer")
                frame = bytes(wire.encode(make_frame(704, "m")))  # ~1 KB: 704 tensor bytes + header
                items = [RawItem(frame, (f"m{i}",)) for i in range(n)]
                t = time.monotonic()
                for i in range(0, n, 500):
                    await q.put_frames(items[i : i + 500])
                await q.close()
                return t

            t0 = asyncio.run(put_msgs())
        else:
            async def put_all() -> None:
                q = make_queue(_queue_cfg(kind, phase["addr"], size), stream=tag, group="bench", consumer="producer")
                for f in frames:
                    await q.put([f])
                await q.close()

            asyncio.run(put_all())
        ctl.send(t0)


# ---------------------------------------------------------------------------- consumer side
def consumer_main(ctl, plan: list[dict]) -> None:
    import asyncio
    import socket
    import time

    import torch

    from services import wire
    from services.queues import make_queue

    torch.set_num_threads(1)
    _warm_up()
    for phase in plan:
        size_total = 0
        kind, n, tag = phase["kind"], phase["n"], phase["tag"]
        if kind == "tcp":
            srv = socket.create_server(("127.0.0.1", 0))
            phase["port"] = srv.getsockname()[1]
            ctl.send(phase["port"])
            conn, _ = srv.accept()
            with conn, srv:
                for _ in range(n):
                    head = bytearray(8)
                    _recv_into(conn, memoryview(head))
                    buf = bytearray(int.from_bytes(head, "little"))
                    _recv_into(conn, memoryview(buf))
                    d = wire.decode(buf, max_frame_bytes=1 << 30)
                    size_total += len(buf)
                    assert d.batch["x"].shape[0] == 4
                t1 = time.monotonic()
                conn.sendall(b"k")
        elif kind == "msgs":
            async def get_msgs() -> float:
                q = make_queue(_queue_cfg("redis", phase["addr"], 1024), stream=tag, group="bench",
                               consumer="consumer")
                await q.depth()
                ctl.send(None)
                got = 0
                while got < n:
                    items = await q.get_frames(500, 10.0)
                    if not items:
                        raise RuntimeError(f"redis stream ran dry after {got} of {n} messages")
                    await q.ack(items)
                    got += len(items)
                t = time.monotonic()
                await q.close()
                return t

            t1 = asyncio.run(get_msgs())
            size_total = n
        else:
            async def get_all() -> tuple[float, int]:
                q = make_queue(_queue_cfg(kind, phase["addr"], phase["size"]), stream=tag, group="bench",
                               consumer="consumer")
                await q.depth()
                ctl.send(None)
                got, total = 0, 0
                while got < n:
                    items = await q.get(8, 30.0)
                    if not items:
                        raise RuntimeError(f"{kind}: no frame within 30 s after {got} of {n}")
                    for it in items:
                        assert it.data.batch["x"].shape[0] == 4
                        total += len(it.raw.payload)
                    await q.ack(items)
                    got += len(items)
                t = time.monotonic()
                await q.close()
                return t, total

            t1, size_total = asyncio.run(get_all())
        ctl.send((t1, size_total))


def _warm_up() -> None:
    """Import and exercise the codec once, so no phase pays first-use costs."""
    from services import wire

    for size in (1024, 1 << 20):
        wire.decode(wire.encode(make_frame(size, "warm")), max_frame_bytes=1 << 30)


def _recv_into(sock, view: memoryview) -> None:
    while view:
        k = sock.recv_into(view)
        if k == 0:
            raise ConnectionError("peer closed")
        view = view[k:]


# ---------------------------------------------------------------------------- driver
def main() -> int:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import multiprocessing as mp
    import tempfile

    from services.queues.broker_process import BrokerProcess
    from services.queues.redis_server import RedisServer

    mb = 1 << 20
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp + "/redis") as redis_srv, \
            BrokerProcess(log_path=tmp + "/broker.log") as broker:
        plan = []
        for size, n in ((mb, args.small_n), (args.big_mb * mb, args.big_n)):
            for kind, addr in (("tcp", ""), ("redis", redis_srv.url), ("embedded", broker.address)):
                plan.append({"kind": kind, "size": size, "n": n, "addr": addr, "tag": f"{kind}{size // mb}mb"})
        plan.append({"kind": "msgs", "size": 1024, "n": args.msgs, "addr": redis_srv.url, "tag": "msgs1kb"})

        ctx = mp.get_context("spawn")
        p_ctl, p_child = ctx.Pipe()
        c_ctl, c_child = ctx.Pipe()
        cons = ctx.Process(target=consumer_main, args=(c_child, plan), daemon=True)
        cons.start()
        prod_plan = [dict(ph) for ph in plan]
        prod = ctx.Process(target=producer_main, args=(p_child, prod_plan), daemon=True)
        prod.start()
        results: dict[tuple[str, int], float] = {}
        try:
            for ph in plan:
                if not c_ctl.poll(300):
                    raise TimeoutError(f"consumer not ready for {ph['tag']}")
                ready = c_ctl.recv()
                p_ctl.send(ready)
                if not p_ctl.poll(600) or not c_ctl.poll(600):
                    raise TimeoutError(f"phase {ph['tag']} did not finish")
                t0 = p_ctl.recv()
                t1, total = c_ctl.recv()
                rate = total / max(t1 - t0, 1e-9)
                results[(ph["kind"], ph["size"])] = rate
                if ph["kind"] == "msgs":
                    print(f"redis 1KB frames: {total} msgs in {t1 - t0:.3f}s = {rate:,.0f} msgs/s", flush=True)
                else:
                    print(f"{ph['kind']:>8} {ph['size'] // mb:>3} MB frames x{ph['n']}: {rate / mb:,.1f} MB/s", flush=True)
        finally:
            for proc in (prod, cons):
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
        big = args.big_mb * mb
        for size in (mb, big):
            tcp = results[("tcp", size)]
            print(f"{size // mb} MB frames: redis/tcp={results[('redis', size)] / tcp:.3f} "
                  f"embedded/tcp={results[('embedded', size)] / tcp:.3f}")
        r = results[("redis", big)] / results[("tcp", big)]
        e = results[("embedded", big)] / results[("tcp", big)]
        m = results[("msgs", 1024)]
        print(f"queues redis_ratio_vs_tcp={r:.3f} embedded_ratio_vs_tcp={e:.3f} redis_msgs_per_s_1kb={m:.0f}")
    return 0


if __name__ == "__main__":
    from services import auth

    auth.provision_temporary()  # this run is a job of its own: its servers and clients share one credential
    sys.exit(main())
