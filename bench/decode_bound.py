"""Benchmark: how many tokens per second a decode step of this model can reach on this machine.

The physical bound that a replica's tokens/s is read against (docs/performance.md,
"Generation"). One decode step of ``B`` sequences multiplies a ``[B, in]`` activation by every
weight matrix of the model once (each attention and MLP projection of every layer, and the
``vocab x hidden`` output head), so its arithmetic is ``2 * B * (weights in matrices)`` FLOPs.
Measured here, with torch on this machine's threads, for each batch size:

- ``gemm``: those matrix products alone, timed back to back (the weights are the model's
  own, in its dtype). Nothing a decode step does can be cheaper: ``B / seconds`` is the
  tokens/s bound at that batch size, and FLOPs / seconds the rate the cores reach on
  these shapes;
- ``hf_step``: one whole decode step of ``transformers``' model (a KV cache of
  ``--context`` tokens per sequence, eager attention, norms, rotary embeddings, the output
  head; no sampling), what a plain torch decode loop would pay per token.

Last line: ``decode_bound tokens_per_s=<gemm bound at the largest batch> gflops=<its rate>
hf_step_tokens_per_s=<the same for hf_step>``.

    python bench/decode_bound.py --model runs/smollm2/model [--batch 32,64,256] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model dir (default: build the tiny test model into a temp dir)")
    p.add_argument("--batch", default="32,64,256", help="comma-separated batch sizes (sequences per decode step)")
    p.add_argument("--context", type=int, default=64, help="tokens already in each sequence's KV cache (hf_step)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the replica's OMP threads)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per measurement (median taken)")
    return p.parse_args(argv)


def _median_seconds(fn, reps: int) -> float:
    for _ in range(2):  # warm-up (thread pool, allocations, first touch of the weights)
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def matrices(model) -> list:
    """Every weight matrix a decode step multiplies by: the linear layers and the output head
    (a tied head is the embedding matrix, counted once, as it is used once)."""
    import torch

    seen, out = set(), []
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            out.append(mod.weight.detach())
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model_dir = args.model
    if model_dir is None:
        from services.modelling.tiny import build_tiny_model

        model_dir = str(build_tiny_model(Path(tempfile.mkdtemp(prefix="meshrl-decode-bound-")) / "model"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    weights = matrices(model)
    params = sum(w.numel() for w in weights)
    dtype = weights[0].dtype
    print(f"model {model_dir}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{params / 1e6:.1f}M in the {len(weights)} matrices a decode step multiplies by, {dtype}; "
          f"{args.threads} threads", flush=True)
    vocab = model.config.vocab_size
    last = None
    with torch.no_grad():
        for b in [int(x) for x in args.batch.split(",") if x.strip()]:
            xs = {w.shape[1]: torch.randn(b, w.shape[1], dtype=dtype) for w in weights}

            def gemms() -> None:
                for w in weights:
                    torch.mm(xs[w.shape[1]], w.t())

            t_gemm = _median_seconds(gemms, args.reps)
            ids = torch.randint(0, vocab, (b, args.context))
            prefill = model(input_ids=ids, use_cache=True)
            cache = prefill.past_key_values
            step_ids = torch.randint(0, vocab, (b, 1))
            pos = torch.full((b, 1), args.context)

            def hf_step() -> None:
                model(input_ids=step_ids, past_key_values=cache, position_ids=pos, use_cache=True)
                cache.crop(-1)  # drop the token just added: the same context every repetition

            t_hf = _median_seconds(hf_step, args.reps)
            gflops = 2 * b * params / t_gemm / 1e9
            last = (b / t_gemm, gflops, b / t_hf)
            print(f"batch {b:4d}: gemm {t_gemm * 1e3:8.2f} ms ({gflops:6.1f} GFLOP/s, {b / t_gemm:8.0f} tokens/s)  "
                  f"hf_step {t_hf * 1e3:8.2f} ms ({b / t_hf:8.0f} tokens/s)", flush=True)
    assert last is not None, "no batch size given"
    print(f"decode_bound tokens_per_s={last[0]:.0f} gflops={last[1]:.1f} hf_step_tokens_per_s={last[2]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
