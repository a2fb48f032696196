"""Benchmark: one GRPO update of meshrl's trainer vs plain PyTorch over the same tokens.

meshrl side: ``TrainerWorker.step`` on one rank (gloo; unwrapped, FSDP2 shards only over several) -- recompute old log-probs
(no-grad forward), GRPO advantages, then the PPO policy update (forward + backward + AdamW
step, gradient accumulation over micro-batches). Baseline, measured in the same run on the
same batch and micro-batches: a plain HuggingFace model, ``forward(labels=...)`` +
``backward`` per micro-batch, one ``AdamW.step()``. The two alternate, ``--reps`` times each
after a warm-up, and the best times are compared (other processes only add time). By
default the clock is the process's CPU time (``--clock cpu``), which other jobs on shared
cores barely disturb; ``--clock wall`` measures elapsed time instead. tokens/s is per CPU
second with the cpu clock.

    python bench/train.py [--layers 4 --hidden 256 --groups 8 --n 4 --prompt 32 --response 32 --threads 1]

On a GPU, ``--device cuda`` (wall clock, synchronised) with ``--model DIR`` (any local
HuggingFace causal LM, e.g. the Qwen2.5-0.5B-shaped one bench/gpu_check.py writes) and
``--mixed-precision`` (meshrl: ``fsdp_config.mixed_precision`` bf16 over float32 master
weights; baseline: ``torch.autocast`` bf16 over the same float32 weights) also prints MFU:
model FLOPs (6 N T for the baseline's forward+backward, 8 N T for meshrl's extra no-grad
recompute; N parameters, T batch tokens) per second over ``--peak-tflops``.

Last line: ``train ratio_vs_torch=<baseline_s / meshrl_s> tokens_per_s=<batch tokens / meshrl_s>``
(plus ``mfu=<meshrl> mfu_torch=<baseline>`` on CUDA).
The recompute forward alone bounds the ratio near 0.75 (an update is ~3 forward costs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--groups", type=int, default=8, help="prompts per batch")
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--response", type=int, default=32, help="response tokens")
    p.add_argument("--micro", type=int, default=8, help="samples per micro-batch")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu",
        help="cpu: process CPU seconds (robust when other jobs share the cores); wall: elapsed seconds",
    )
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads for both sides (0 = all cores; >1 suffers badly on a loaded machine)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--model", default=None, help="a local HuggingFace model directory instead of a tiny one")
    p.add_argument("--mixed-precision", action="store_true", help="compute in bf16 over float32 weights")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the card's dense bf16 peak for MFU (989: H100/H200 SXM datasheet)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    import torch
    import torch.distributed as dist

    from services.config.views import TrainerView
    from services.modelling.tiny import TinyModelSpec, build_tiny_model
    from services.net import free_port
    from trainer_svc.fsdp import init_distributed, load_causal_lm
    from trainer_svc.synthetic import make_batch
    from trainer_svc.worker import TrainerWorker

    cuda = args.device == "cuda"
    if cuda:
        args.clock = "wall"  # GPU work is not this process's CPU time
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = Path(args.model)
        else:
            heads = max(2, args.hidden // 64)
            model_dir = build_tiny_model(
                Path(tmp) / "model",
                TinyModelSpec(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                              num_attention_heads=heads, num_key_value_heads=max(1, heads // 2)),
            )
        samples = args.groups * args.n
        fsdp = {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}} if args.mixed_precision else {}
        spec = TrainerView(
            model={"path": str(model_dir)}, data={"train_batch_size": args.groups}, rollout={"n": args.n},
            actor={"ppo_mini_batch_size": args.groups, "ppo_micro_batch_size_per_gpu": args.micro,
                   "log_prob_micro_batch_size_per_gpu": args.micro, "optim": {"lr": 1e-6}, "fsdp_config": fsdp},
            trainer={"total_steps": 1000},
        )
        ctx = init_distributed(args.device, timeout_s=600)
        worker = TrainerWorker(spec, ctx)
        vocab = worker.model.config.vocab_size
        batch = make_batch(args.groups, n=args.n, prompt_len=args.prompt, response_len=args.response,
                           vocab_size=vocab, seed=0)
        tokens = int(batch.batch["attention_mask"].sum())
        base_model = load_causal_lm(str(model_dir), device=ctx.device)
        n_params = sum(p.numel() for p in base_model.parameters())
        base_opt = torch.optim.AdamW(base_model.parameters(), lr=1e-6, weight_decay=0.01, foreach=True)
        dev = batch.select(deepcopy=True).to(ctx.device).batch if cuda else batch.batch
        ids, am, pos = dev["input_ids"], dev["attention_mask"], dev["position_ids"]
        labels = ids.masked_fill(am == 0, -100)

        def clock() -> float:
            if cuda:
                torch.cuda.synchronize()
            return time.process_time() if args.clock == "cpu" else time.perf_counter()

        def baseline() -> float:
            t0 = clock()
            base_model.train()
            base_opt.zero_grad(set_to_none=True)
            for i in range(0, samples, args.micro):
                sl = slice(i, i + args.micro)
                with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.mixed_precision):
                    out = base_model(input_ids=ids[sl], attention_mask=am[sl], position_ids=pos[sl], labels=labels[sl])
                out.loss.backward()
            torch.nn.utils.clip_grad_norm_(base_model.parameters(), 1.0)
            base_opt.step()
            return clock() - t0

        def ours() -> float:
            data = batch.select(deepcopy=True)
            t0 = clock()
            res = worker.step(data)
            if not res.applied:
                raise RuntimeError("the GRPO step was skipped")
            return clock() - t0

        baseline(), ours()  # warm-up
        t_base, t_ours = [], []
        for _ in range(args.reps):
            t_base.append(baseline())
            t_ours.append(ours())
        # Best of N (timeit's rule): other processes only ever add time, so the minimum is
        # the least disturbed measurement of each side; medians are printed for reference.
        mb, mo = min(t_base), min(t_ours)
        dist.destroy_process_group()
    shape = f"{args.model}" if args.model else f"{args.layers} layers, hidden {args.hidden}"
    where = torch.cuda.get_device_name() if cuda else f"cpu, threads {torch.get_num_threads()}"
    precision = "bf16 mixed (float32 master)" if args.mixed_precision else "float32"
    print(f"model: {shape}, {n_params / 1e6:.2f}M params; batch {samples} samples, {tokens} tokens; {where}; "
          f"{precision}; clock {args.clock} (seconds below)")
    print(f"plain torch fwd+bwd+step: best {mb:.3f}s median {statistics.median(t_base):.3f}s  "
          f"{[round(t, 3) for t in t_base]}")
    print(f"meshrl GRPO update (recompute + update, 1 rank): best {mo:.3f}s "
          f"median {statistics.median(t_ours):.3f}s  {[round(t, 3) for t in t_ours]}")
    line = f"train ratio_vs_torch={mb / mo:.3f} tokens_per_s={tokens / mo:.1f}"
    if cuda:
        peak = args.peak_tflops * 1e12
        line += f" mfu={8 * n_params * tokens / mo / peak:.3f} mfu_torch={6 * n_params * tokens / mb / peak:.3f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
