"""Benchmark: the trainer's CPU seconds per GRPO step with a LoRA adapter against full fine-tuning.

Two :class:`~trainer_svc.worker.TrainerWorker` s in this process (one rank, gloo) on the same
model and the same batch: one trains every parameter, the other a PEFT adapter
(``model.lora_rank``/``lora_alpha``/``target_modules``; the base frozen, the optimizer holding
the adapter only, the reference policy the base with the adapter disabled). A step is what
the trainer does per batch: the no-grad recompute of the old log-probs, GRPO advantages,
the PPO update over the mini- and micro-batches. The two alternate ``--reps`` times after a
warm-up; the clock is this process's CPU time (what the trainer costs the machine, little
disturbed by other processes); the best of each side is compared, medians printed beside.

Defaults are ``examples/smollm2_lora.yaml``'s trainer settings against
``examples/smollm2.yaml``'s: 4 prompts x 8 samples, micro-batch 4, two mini-batches,
responses of 32 tokens (prompts of 64: the questions with the chat template run 55-70),
gradient checkpointing in the full fine-tuning run only (``--checkpointing``): the memory an
adapter run does not spend on the base's gradients and AdamW moments (1.6 GB for SmolLM2 in
float32) holds the activations instead, which saves the backward's second forward. ``--model`` is a local Hugging Face directory (the examples':
``runs/smollm2/model``, written by ``meshrl make-model smollm2-135m-instruct``); without it a
tiny random model is built here. ``--lora-layer peft`` runs the adapter with PEFT's own LoRA
layers instead of the trainer's fused ones (``trainer_svc/lora_linear.py``): the trainer as it
was before them.

    python bench/lora_train.py --model runs/smollm2/model [--rank 16 --reps 3 --threads 1]

Last line: ``lora_train cpu_ratio=<lora / full> full_s=<best> lora_s=<best> trainable=<adapter
params / all params>``.
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
    p.add_argument("--model", default=None, help="a local Hugging Face causal LM (default: a tiny one built here)")
    p.add_argument("--rank", type=int, default=16, help="model.lora_rank")
    p.add_argument("--alpha", type=float, default=32.0, help="model.lora_alpha")
    p.add_argument("--targets", default="all-linear", help="model.target_modules")
    p.add_argument("--groups", type=int, default=4, help="prompts per batch")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--response", type=int, default=32, help="response tokens")
    p.add_argument("--mini", type=int, default=2, help="prompts per optimizer step (ppo_mini_batch_size)")
    p.add_argument("--micro", type=int, default=4, help="samples per micro-batch")
    p.add_argument("--checkpointing", choices=("full", "lora", "both", "none"), default="full",
                   help="which side recomputes activations in the backward (gradient checkpointing); "
                        "default as the examples: full fine-tuning does, the adapter run does not")
    p.add_argument("--lora-layer", choices=("fused", "peft"), default="fused",
                   help="the adapter run's LoRA linear layers: the trainer's fused ones (trainer_svc/lora_linear.py) "
                        "or PEFT's own (the trainer before them)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: all cores)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    import torch
    import torch.distributed as dist

    from services.config.views import TrainerView
    from services.modelling.tiny import TinyModelSpec, build_tiny_model
    from services.net import free_port
    from trainer_svc import worker as worker_module
    from trainer_svc.fsdp import init_distributed
    from trainer_svc.lora import apply_lora
    from trainer_svc.synthetic import make_batch
    from trainer_svc.worker import TrainerWorker

    if args.lora_layer == "peft":  # the trainer's apply_lora, without switching PEFT's layers to the fused ones
        worker_module.apply_lora = lambda model, mcfg: apply_lora(model, mcfg, fused=False)

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model) if args.model else build_tiny_model(
            Path(tmp) / "model", TinyModelSpec(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=1))
        ctx = init_distributed("cpu", timeout_s=600)

        def worker(lora: bool) -> TrainerWorker:
            model = {"path": str(model_dir)}
            if lora:
                model.update(lora_rank=args.rank, lora_alpha=args.alpha, target_modules=args.targets)
            return TrainerWorker(TrainerView(
                model=model, data={"train_batch_size": args.groups}, rollout={"n": args.n},
                actor={"ppo_mini_batch_size": args.mini, "ppo_micro_batch_size_per_gpu": args.micro,
                       "log_prob_micro_batch_size_per_gpu": args.micro, "optim": {"lr": 1e-6},
                       "gradient_checkpointing": args.checkpointing in ("both", "lora" if lora else "full")},
                trainer={"total_steps": 1000}), ctx)

        full, lora = worker(False), worker(True)
        trainable = sum(p.numel() for p in lora.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in full.model.parameters())
        batch = make_batch(args.groups, n=args.n, prompt_len=args.prompt, response_len=args.response,
                           vocab_size=full.model.config.vocab_size, seed=0)

        def step(w: TrainerWorker) -> float:
            data = batch.select(deepcopy=True)
            t0 = time.process_time()
            if not w.step(data).applied:
                raise RuntimeError("the GRPO step was skipped")
            return time.process_time() - t0

        step(full), step(lora)  # warm-up
        t_full, t_lora = [], []
        for _ in range(args.reps):
            t_full.append(step(full))
            t_lora.append(step(lora))
        dist.destroy_process_group()
    bf, bl = min(t_full), min(t_lora)
    print(f"model: {args.model or 'tiny'}, {total / 1e6:.1f}M params; adapter rank {args.rank} on {args.targets}: "
          f"{trainable / 1e6:.2f}M trainable; batch {args.groups}x{args.n}, micro {args.micro}, "
          f"gradient checkpointing: {args.checkpointing}; LoRA layers: {args.lora_layer}; "
          f"threads {torch.get_num_threads()}; CPU seconds per step")
    print(f"full: best {bf:.2f} median {statistics.median(t_full):.2f} {[round(t, 2) for t in t_full]}")
    print(f"lora: best {bl:.2f} median {statistics.median(t_lora):.2f} {[round(t, 2) for t in t_lora]}")
    print(f"lora_train cpu_ratio={bl / bf:.3f} full_s={bf:.2f} lora_s={bl:.2f} trainable={trainable / total:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
