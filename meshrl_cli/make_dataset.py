"""``meshrl make-dataset TASK OUT``: write a dataset in verl's parquet format.

Built-in synthetic tasks (``arith``, ``countdown``) and reasoning-gym tasks
(``reasoning-gym:<task>[,<task>...]``, scored by each task's own verifier) are generated;
``gsm8k`` and ``math`` convert a local file in the usual public layout (``--from``: parquet,
JSON lines, JSON or a ``datasets`` save_to_disk directory; nothing is downloaded)::

    meshrl make-dataset gsm8k data/gsm8k --from gsm8k/train.jsonl            # -> data/gsm8k/train.parquet
    meshrl make-dataset math data/math --from math/test.parquet --split test  # -> data/math/test.parquet
    meshrl make-dataset reasoning-gym:chain_sum,leg_counting data/rg --size 2000 --seed 0 \
        --config chain_sum.max_terms=2                                        # -> data/rg/{train,test}.parquet
"""

from __future__ import annotations

import argparse

CONVERTED = ("gsm8k", "math")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", type=_task_name, metavar="TASK",
                   help="built-in task (arith, countdown), reasoning-gym:<task>[,<task>...], or layout to convert "
                        "(gsm8k: question/answer with '#### N'; math: problem/solution with \\boxed{})")
    p.add_argument("out_dir", help="directory to write <split>.parquet into")
    p.add_argument("--from", dest="src", action="append", default=None,
                   help="gsm8k/math: local file or datasets directory to convert (repeat for several splits)")
    p.add_argument("--split", action="append", default=None,
                   help="gsm8k/math: split name of each --from (default: 'test' if the name says so, else 'train')")
    p.add_argument("--train-size", "--size", type=int, default=2000, help="generated: training prompts (default 2000)")
    p.add_argument("--test-size", type=int, default=200, help="generated: held-out prompts (default 200)")
    p.add_argument("--seed", type=int, default=0, help="generated: random seed (test: seed+1; reasoning-gym: seed+size)")
    p.add_argument("--max-operand", type=int, default=20, help="arith: largest operand")
    p.add_argument("--ops", default="+-", help="arith: operators to draw from, out of '+-*'")
    p.add_argument("--terms", type=int, default=2, help="arith: operands per prompt; above 2 the rows carry a "
                   "worked solution (extra_info.solution) the warm start learns the format from")
    p.add_argument("--num-numbers", type=int, default=3, help="countdown: numbers per puzzle")
    p.add_argument("--config", action="append", default=[], metavar="TASK.FIELD=VALUE",
                   help="reasoning-gym: a generator setting of one task, e.g. chain_sum.max_terms=2 (repeatable)")
    p.add_argument("--instruction", default="",
                   help="reasoning-gym: text appended to every question, e.g. 'Answer with just the number.'")


def _task_name(value: str) -> str:
    if value in ("arith", "countdown", *CONVERTED) or value.startswith("reasoning-gym:"):
        return value
    raise argparse.ArgumentTypeError(f"unknown task {value!r} (arith, countdown, gsm8k, math, "
                                     "or reasoning-gym:<task>[,<task>...])")


def _split_of(src: str) -> str:
    from pathlib import Path

    name = Path(src).name.lower()
    return "test" if "test" in name or "val" in name else "train"


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from services.data.parquet import write_rows

    out = Path(args.out_dir)
    if args.task in CONVERTED:
        from services.data.convert import convert_file

        if not args.src:
            raise ValueError(f"make-dataset {args.task}: give the local file to convert with --from FILE "
                             "(nothing is downloaded)")
        splits = args.split or [_split_of(s) for s in args.src]
        if len(splits) != len(args.src):
            raise ValueError(f"{len(args.src)} --from but {len(splits)} --split; give one --split per --from")
        if len(set(splits)) != len(splits):
            raise ValueError(f"two inputs would both write {out}/<split>.parquet ({splits}); name them with --split")
        for src, split in zip(args.src, splits):
            rows = convert_file(args.task, src, split)
            path = write_rows(rows, out / f"{split}.parquet")
            print(f"wrote {len(rows)} {args.task} prompts from {src} to {path}")
        return 0
    if args.src:
        raise ValueError(f"--from is for gsm8k/math; {args.task} is generated")
    if args.task.startswith("reasoning-gym:"):
        return _reasoning_gym(args, out)
    if args.config or args.instruction:
        raise ValueError("--config and --instruction are for reasoning-gym tasks")
    from services.data import synthetic

    for split, n, seed in (("train", args.train_size, args.seed), ("test", args.test_size, args.seed + 1)):
        if args.task == "arith":
            rows = synthetic.arith_rows(n, seed=seed, max_operand=args.max_operand, ops=args.ops, split=split,
                                        terms=args.terms)
        else:
            rows = synthetic.countdown_rows(n, seed=seed, num_numbers=args.num_numbers, split=split)
        path = write_rows(rows, out / f"{split}.parquet")
        print(f"wrote {len(rows)} {args.task} prompts to {path}")
    return 0


def _reasoning_gym(args: argparse.Namespace, out) -> int:
    from services.data import reasoning_tasks as rt
    from services.data.parquet import write_rows

    tasks = rt.parse_tasks(args.task)
    configs = rt.parse_configs(args.config, tasks)
    train = rt.task_rows(tasks, args.train_size, args.seed, "train", configs, args.instruction)
    test = rt.held_out(rt.task_rows(tasks, args.test_size, rt.test_seed(args.seed, args.train_size), "test", configs,
                                    args.instruction), train)
    for split, rows in (("train", train), ("test", test)):
        path = write_rows(rows, out / f"{split}.parquet")
        print(f"wrote {len(rows)} reasoning-gym prompts ({', '.join(tasks)}) to {path}")
    return 0
