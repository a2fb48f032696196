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

Last line: ``train ratio_vs_torch=<baseline_s / meshrl_s> tokens_per_s=<batch tokens / meshrl_s>``.
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

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with tempfile.TemporaryDirectory() as tmp:
        heads = max(2, args.hidden // 64)
        model_dir = build_tiny_model(
            Path(tmp) / "model",
            TinyModelSpec(hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                          num_attention_heads=heads, num_key_value_heads=max(1, heads // 2)),
        )
        samples = args.groups * args.n
        spec = TrainerView(
            model={"path": str(model_dir)}, data={"train_batch_size": args.groups}, rollout={"n": args.n},
            actor={"ppo_mini_batch_size": args.groups, "ppo_micro_batch_size_per_gpu": args.micro,
                   "log_prob_micro_batch_size_per_gpu": args.micro, "optim": {"lr": 1e-6}},
            trainer={"total_steps": 1000},
        )
        ctx = init_distributed("cpu", timeout_s=600)
        worker = TrainerWorker(spec, ctx)
        vocab = worker.model.config.vocab_size
        batch = make_batch(args.groups, n=args.n, prompt_len=args.prompt, response_len=args.response,
                           vocab_size=vocab, seed=0)
        tokens = int(batch.batch["attention_mask"].sum())
        n_params = sum(p.numel() for p in load_causal_lm(str(model_dir)).parameters())

        base_model = load_causal_lm(str(model_dir))
        base_opt = torch.optim.AdamW(base_model.parameters(), lr=1e-6, weight_decay=0.01, foreach=True)
        ids, am, pos = batch.batch["input_ids"], batch.batch["attention_mask"], batch.batch["position_ids"]
        labels = ids.masked_fill(am == 0, -100)

        clock = time.process_time if args.clock == "cpu" else time.perf_counter

        def baseline() -> float:
            t0 = clock()
            base_model.train()
            base_opt.zero_grad(set_to_none=True)
            for i in range(0, samples, args.micro):
                sl = slice(i, i + args.micro)
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
    print(f"model: {args.layers} layers, hidden {args.hidden}, {n_params / 1e6:.2f}M params; batch {samples} samples, "
          f"{tokens} tokens; threads {torch.get_num_threads()}; clock {args.clock} (seconds below)")
    print(f"plain torch fwd+bwd+step: best {mb:.3f}s median {statistics.median(t_base):.3f}s  "
          f"{[round(t, 3) for t in t_base]}")
    print(f"meshrl GRPO update (recompute + update, 1 rank): best {mo:.3f}s "
          f"median {statistics.median(t_ours):.3f}s  {[round(t, 3) for t in t_ours]}")
    print(f"train ratio_vs_torch={mb / mo:.3f} tokens_per_s={tokens / mo:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
