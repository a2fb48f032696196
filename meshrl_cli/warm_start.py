"""``meshrl warm-start MODEL DATA OUT``: a short supervised warm start before RL."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="HuggingFace model directory to start from")
    p.add_argument("data", nargs="+", help="verl-style row file(s) (parquet, jsonl, json, datasets dir): "
                   "prompt + reward_model.ground_truth")
    p.add_argument("--out", required=True, help="directory to write the warmed-up model to")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step (default 32)")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate (default 2e-3)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--chat-template", default=None, help="Jinja chat template text or .jinja file (default: the model's)")


def run(args: argparse.Namespace) -> int:
    from trainer_svc.warmstart import warm_start

    res = warm_start(args.model, args.data, args.out, steps=args.steps, batch_size=args.batch_size,
                     lr=args.lr, seed=args.seed, chat_template=args.chat_template)
    print(f"warm start done: steps={res.steps} loss={res.final_loss:.4f} "
          f"expected_reward={res.p_correct:.3f} -> {res.out_dir}")
    return 0
