"""``meshrl make-dataset TASK OUT``: write a built-in synthetic task in verl's parquet format."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", choices=["arith", "countdown"], help="which built-in task")
    p.add_argument("out_dir", help="directory to write train.parquet and test.parquet into")
    p.add_argument("--train-size", type=int, default=2000, help="training prompts (default 2000)")
    p.add_argument("--test-size", type=int, default=200, help="held-out prompts (default 200)")
    p.add_argument("--seed", type=int, default=0, help="random seed (test uses seed+1)")
    p.add_argument("--max-operand", type=int, default=20, help="arith: largest operand")
    p.add_argument("--ops", default="+-", help="arith: operators to draw from, out of '+-*'")
    p.add_argument("--num-numbers", type=int, default=3, help="countdown: numbers per puzzle")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from services.data import synthetic
    from services.data.parquet import write_rows

    out = Path(args.out_dir)
    for split, n, seed in (("train", args.train_size, args.seed), ("test", args.test_size, args.seed + 1)):
        if args.task == "arith":
            rows = synthetic.arith_rows(n, seed=seed, max_operand=args.max_operand, ops=args.ops, split=split)
        else:
            rows = synthetic.countdown_rows(n, seed=seed, num_numbers=args.num_numbers, split=split)
        path = write_rows(rows, out / f"{split}.parquet")
        print(f"wrote {len(rows)} {args.task} prompts to {path}")
    return 0
