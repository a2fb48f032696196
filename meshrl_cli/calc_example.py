"""Prepare the tool-use example (``examples/tools.yaml``): two-digit multiplication with a
calculator tool.

    python -m meshrl_cli.calc_example --out runs/tools
    meshrl run examples/tools.yaml

The tiny model (0.45M parameters) cannot multiply ``47*28`` itself. It can learn to call
the calculator (``<tool_call>{"name":"calc","arguments":{"expr":"47*28"}}</tool_call>``)
and copy the tool's answer. This script:

1. builds the tiny model (``OUT/model``) with :data:`CALL_TOKENS` as extra tokens, as Qwen's
   tokenizer has ``<tool_call>`` as one token: a call is 9 tokens (4 fixed, 5 copied from
   the prompt) instead of 62 single characters;
2. writes ``a*b=`` prompts with ``32 <= a, b <= 99`` in verl's parquet format (``OUT/data``;
   data source ``meshrl/arith``; with ``reward.solution_str: final_turn`` in
   ``examples/tools.yaml`` the built-in scorer rewards the last integer of the model's final
   turn, not the calculator's observation). Every product has four digits, so every transcript has the same layout and
   each copied token sits at a fixed distance from its source;
3. warm-starts it (``OUT/model-warm``) on tool-use transcripts, cut into turns: prompt ->
   call, and prompt + call + observation -> answer. The loss is on the model's tokens only.
   The observation is rendered exactly as the agent loop renders it. Every ``--check-every``
   steps it measures the expected reward on held-out prompts and stops once it reaches
   ``--target``: the model knows the format but still miscopies digits, so the reward
   starts low and RL does the rest.

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


#: the call's fixed parts, single tokens of the example's tokenizer
CALL_TOKENS = ("<tool_call>", '{"name":"calc","arguments":{"expr":"', '"}}', "</tool_call>")

LO, HI = 32, 99  # two-digit operands whose product has four digits: every transcript has one layout


#: the system message of ``--data-only``: a pretrained chat model learns the call from words alone
TOOL_SYSTEM = ("You have a calculator tool named calc. To use it, reply with only "
               + call_text("<expression>").replace(",", ", ").replace(":", ": ")
               + " and its result comes back in the next message. Then answer with just the number.")


def calc_rows(n: int, *, seed: int, split: str = "train", lo: int = LO, hi: int = HI,
              system: str | None = None) -> list[dict]:
    """``n`` prompts ``a*b=`` with operands in ``lo..hi``, in verl's row schema (after a
    ``system`` message when one is given)."""
    import random

    from services.data.synthetic import ARITH_SOURCE

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        head = [{"role": "system", "content": system}] if system else []
        question = f"What is {a}*{b}?" if system else f"{a}*{b}="
        rows.append({"data_source": ARITH_SOURCE, "prompt": [*head, {"role": "user", "content": question}],
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
    ap = argparse.ArgumentParser(prog="python -m meshrl_cli.calc_example", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/tools", help="where the model, data and warm model go")
    ap.add_argument("--target", type=float, default=0.1,
                    help="stop the warm start once the held-out expected reward reaches this")
    ap.add_argument("--warm-steps", type=int, default=400, help="most supervised warm-start steps")
    ap.add_argument("--check-every", type=int, default=2, help="steps between held-out checks")
    ap.add_argument("--lr", type=float, default=3e-3, help="warm-start learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (one is as fast for this model, and much faster on a busy machine)")
    ap.add_argument("--data-only", action="store_true",
                    help="write only the prompts, each after a system message that describes the tool "
                         "(for a pretrained chat model: examples/smollm2_tools.yaml)")
    args = ap.parse_args(argv)
    if args.data_only:
        from services.data.parquet import write_rows

        data = Path(args.out).resolve() / "data"
        write_rows(calc_rows(400, seed=args.seed, system=TOOL_SYSTEM), data / "train.parquet")
        write_rows(calc_rows(64, seed=args.seed + 1, split="test", system=TOOL_SYSTEM), data / "test.parquet")
        print(f"wrote 400 training and 64 held-out prompts to {data}")
        return 0
    if not 0.0 < args.target <= 1.0:
        ap.error(f"--target must be in (0, 1], got {args.target}")

    import torch
    from transformers import AutoTokenizer

    from services.data.parquet import write_rows
    from services.modelling.tiny import TinyModelSpec, build_tiny_model
    from trainer_svc.warmstart import expected_exact_match, warm_start

    torch.set_num_threads(max(1, args.threads))
    out = Path(args.out).resolve()
    model, warm, data = out / "model", out / "model-warm", out / "data"
    build_tiny_model(model, TinyModelSpec(seed=args.seed, added_tokens=CALL_TOKENS))  # deterministic, a second
    train = calc_rows(4000, seed=args.seed)
    test = calc_rows(200, seed=args.seed + 1, split="test")
    write_rows(train, data / "train.parquet")
    write_rows(test, data / "test.parquet")
    tok = AutoTokenizer.from_pretrained(model)
    calls, answers = transcript_examples(train, tok)
    t_calls, t_answers = transcript_examples(test, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    seen: dict[str, float] = {}

    def measure(m, n: int) -> float:
        seen["p_call"] = expected_exact_match(m, t_calls[:n], pad)
        seen["p_answer"] = expected_exact_match(m, t_answers[:n], pad)
        return seen["p_call"] * seen["p_answer"]

    def reached(m, step: int) -> bool:  # a cheap check on 64 held-out prompts
        return measure(m, 64) >= args.target

    res = warm_start(model, [], warm, steps=args.warm_steps, lr=args.lr, seed=args.seed, max_len=256,
                     log_every=0, examples=calls + answers, stop_when=reached, check_every=args.check_every)
    measure(_load(warm), len(test))  # the saved model on all held-out prompts
    p_call, p_answer = seen["p_call"], seen["p_answer"]
    print(f"warm start: {res.steps} steps, loss {res.final_loss:.3f} -> {warm}")
    print(f"calc_example p_call={p_call:.3f} p_answer={p_answer:.3f} expected_reward={p_call * p_answer:.3f}")
    return 0


def _load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


if __name__ == "__main__":
    raise SystemExit(main())
