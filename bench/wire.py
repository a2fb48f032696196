"""Benchmark: services.wire encode+decode of a rollout batch vs memcpy and vs pickle/torch.save.

All three are measured in this run on the same batch, best of ``--reps`` repetitions each:

* ours: ``wire.decode(wire.encode(data))`` (one frame in a fresh bytearray; zero-copy decode);
* memcpy: copying the same tensor bytes into a freshly allocated buffer — the faster of
  ``torch.Tensor.copy_`` into ``torch.empty`` and a ``bytes`` copy of each tensor's memory;
* pickle: the faster of (a) verl's default path — ``torch.save`` of the batch to a BytesIO
  inside pickling, then ``torch.load`` — and (b) ``pickle.dumps``/``loads`` (protocol 5) of
  the DataProto.

Throughput = tensor payload bytes / (encode + decode seconds). The last line is
``wire ratio_vs_memcpy=<R> ratio_vs_pickle=<S> gbps=<G>`` with R = ours / memcpy and
S = ours / pickle (the faster pickle path, so S is conservative).
"""

from __future__ import annotations

import argparse


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1024, help="sequences (default 1024)")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    p.add_argument("--small", action="store_true", help="64 x 512: a quick smoke run")
    p.add_argument("--reps", type=int, default=7, help="repetitions per method; the best counts")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    return p.parse_args()


def make_batch(b: int, t: int):
    """A rollout-shaped DataProto: int64 ids/masks/positions/responses [b, t], float32
    log-probs [b, t], uid/data_source object columns [b], a small meta_info."""
    import numpy as np
    import torch

    from services.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    tensors = {
        "input_ids": torch.randint(0, 151_000, (b, t), generator=g),
        "attention_mask": torch.ones(b, t, dtype=torch.int64),
        "position_ids": torch.arange(t).expand(b, t).contiguous(),
        "responses": torch.randint(0, 151_000, (b, t), generator=g),
        "rollout_log_probs": torch.randn(b, t, generator=g),
        "old_log_probs": torch.randn(b, t, generator=g),
    }
    non_tensors = {
        "uid": np.array([f"prompt-{i // 8:06d}" for i in range(b)], dtype=object),
        "data_source": np.array(["openai/gsm8k" if i % 2 else "countdown" for i in range(b)], dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"eos_token_id": 2, "temperature": 1.0})


def best_seconds(fn, reps: int) -> float:
    """Best wall time of ``reps`` calls of ``fn`` (results dropped between calls)."""
    import gc
    import time

    best = float("inf")
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        del out
        best = min(best, dt)
    return best


def main() -> int:
    args = parse_args()
    import io
    import pickle

    import torch

    from services import wire

    if args.threads:
        torch.set_num_threads(args.threads)
    b, t = (64, 512) if args.small else (args.batch, args.seq_len)
    data = make_batch(b, t)
    tensors = [data.batch[k] for k in data.batch.keys()]
    payload = sum(x.numel() * x.element_size() for x in tensors)
    print(f"batch {b} x {t}: {len(tensors)} tensors, {payload / 2**20:.1f} MiB of tensor bytes; torch threads {torch.get_num_threads()}")

    # correctness first: the frame must round-trip exactly
    back = wire.decode(wire.encode(data))
    assert all(torch.equal(data.batch[k], back.batch[k]) for k in data.batch.keys())
    assert all((data.non_tensor_batch[k] == back.non_tensor_batch[k]).all() for k in data.non_tensor_batch)

    def ours():
        return wire.decode(wire.encode(data))

    def memcpy_torch():
        dst = torch.empty(payload, dtype=torch.uint8)
        pos = 0
        for x in tensors:
            n = x.numel() * x.element_size()
            dst[pos : pos + n].copy_(x.reshape(-1).view(torch.uint8))
            pos += n
        return dst

    def memcpy_bytes():
        return [bytes(x.reshape(-1).view(torch.uint8).numpy()) for x in tensors]

    def verl_torch_save():  # verl's default DataProto pickling: torch.save of the batch
        buf = io.BytesIO()
        torch.save(data.batch, buf)
        blob = pickle.dumps((buf.getvalue(), data.non_tensor_batch, data.meta_info), protocol=pickle.HIGHEST_PROTOCOL)
        raw, _nt, _meta = pickle.loads(blob)
        return torch.load(io.BytesIO(raw), weights_only=False, map_location="cpu")

    def plain_pickle():
        return pickle.loads(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))

    # methods take turns within each repetition, so a busy machine slows all of them alike
    methods = {"ours": ours, "mt": memcpy_torch, "mb": memcpy_bytes, "vs": verl_torch_save, "pk": plain_pickle}
    best = {k: float("inf") for k in methods}
    for _ in range(max(1, args.reps)):
        for k, fn in methods.items():
            best[k] = min(best[k], best_seconds(fn, 1))
    s_ours, s_mt, s_mb, s_vs, s_pk = (best[k] for k in methods)
    gb = payload / 1e9
    for name, s in [("wire encode+decode", s_ours), ("memcpy torch copy_", s_mt), ("memcpy bytes()", s_mb),
                    ("verl torch.save+load", s_vs), ("pickle dumps+loads", s_pk)]:
        print(f"  {name:24s} {s * 1e3:9.2f} ms  {gb / s:7.2f} GB/s")
    s_memcpy = min(s_mt, s_mb)
    s_pickle = min(s_vs, s_pk)
    r = s_memcpy / s_ours
    s = s_pickle / s_ours
    print(f"wire ratio_vs_memcpy={r:.3f} ratio_vs_pickle={s:.3f} gbps={gb / s_ours:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
