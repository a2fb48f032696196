"""Prepare the tool-use example (``examples/tools.yaml``): two-digit multiplication with a
calculator tool.

    python -m services.cli.calc_example --out runs/tools
    meshrl run examples/tools.yaml

The tiny model (0.45M parameters) cannot multiply ``47*28`` itself. It can learn to call
the calculator (``<tool_call>{"name":"calc","arguments":{"expr":"47*28"}}</tool_call>``)
and copy the tool's answer. This script:

1. builds the tiny model (``OUT/model``) and writes ``a*b=`` prompts with ``10 <= a, b <= 99``
   in verl's parquet format (``OUT/data``; data source ``meshrl/arith``, so the built-in
   scorer rewards the last integer of the trajectory);
2. warm-starts it briefly (``OUT/model-warm``) on tool-use transcripts, cut into turns:
   prompt -> call, and prompt + call + observation -> answer. The observation is rendered
   exactly as the agent loop renders it. The warm start stops early, so the model knows the
   format but still miscopies digits: the expected reward starts low, and RL does the rest.

It prints ``calc_example p_call=<P> p_answer=<Q> expected_reward=<P*Q>`` (exact-match
probabilities at temperature 1 on held-out prompts).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def call_text(expr: str) -> str:
    """The Hermes-format call the model is taught to write."""
    return "<tool_call>" + json.dumps({"name": "calc", "arguments": {"expr": expr}}, separators=(",", ":")) + "</tool_call>"


def calc_rows(n: int, *, seed: int, split: str = "train") -> list[dict]:
    """``n`` prompts ``a*b=`` with two-digit operands (10..99), in verl's row schema."""
    import random

    from services.data.synthetic import ARITH_SOURCE

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"data_source": ARITH_SOURCE, "prompt": [{"role": "user", "content": f"{a}*{b}="}],
                     "ability": "arithmetic", "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                     "extra_info": {"split": split, "index": i, "a": a, "b": b, "op": "*"}})
    return rows


def transcript_examples(rows, tokenizer) -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]]]:
    """``(call examples, answer examples)``: ``(ids, context length)`` pairs (loss after the context)."""
    from rollout_svc.agent.loop import ObservationRenderer
    from services.data.prompts import apply_template

    eos = tokenizer.eos_token_id
    render = ObservationRenderer(tokenizer, [eos])
    calls, answers = [], []
    for r in rows:
        info = r["extra_info"]
        expr = f"{info['a']}{info['op']}{info['b']}"
        truth = str(r["reward_model"]["ground_truth"])
        p = list(apply_template(tokenizer, r["prompt"], None))
        c = tokenizer.encode(call_text(expr), add_special_tokens=False) + [eos]
        obs = render.render([{"role": "tool", "content": truth}], turn_closed=True)
        a = tokenizer.encode(truth, add_special_tokens=False) + [eos]
        calls.append((p + c, len(p)))
        ctx = p + c + obs
        answers.append((ctx + a, len(ctx)))
    return calls, answers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.cli.calc_example", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/tools", help="where the model, data and warm model go")
    ap.add_argument("--warm-steps", type=int, default=120, help="supervised warm-start steps")
    ap.add_argument("--lr", type=float, default=2e-3, help="warm-start learning rate")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.data.parquet import write_rows
    from services.modelling.tiny import build_tiny_model
    from services.warmstart import expected_exact_match, warm_start

    out = Path(args.out).resolve()
    model, warm, data = out / "model", out / "model-warm", out / "data"
    if not (model / "config.json").exists():
        build_tiny_model(model)
    train = calc_rows(4000, seed=args.seed)
    test = calc_rows(200, seed=args.seed + 1, split="test")
    write_rows(train, data / "train.parquet")
    write_rows(test, data / "test.parquet")
    tok = AutoTokenizer.from_pretrained(model)
    calls, answers = transcript_examples(train, tok)
    examples = calls + answers
    random.Random(args.seed).shuffle(examples)
    res = warm_start(model, [], warm, steps=args.warm_steps, lr=args.lr, seed=args.seed, max_len=256,
                     log_every=0, examples=examples)
    m = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    t_calls, t_answers = transcript_examples(test, tok)
    p_call = expected_exact_match(m, t_calls, pad)
    p_answer = expected_exact_match(m, t_answers, pad)
    print(f"warm start: {res.steps} steps, loss {res.final_loss:.3f} -> {warm}")
    print(f"calc_example p_call={p_call:.3f} p_answer={p_answer:.3f} expected_reward={p_call * p_answer:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
