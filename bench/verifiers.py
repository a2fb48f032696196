"""Benchmark (quality, not speed): the standard verifier against the hand-written scorers.

``bench/verifier_cases.json`` holds responses whose correctness was decided by hand
(``right``), in two styles: ``gsm8k`` (checked by the hand-written :mod:`gsm8k` scorer,
verl's strict ``#### N``) and ``math`` (checked by :mod:`math_boxed`). Every case is also
checked by the ``math_verify`` scorer (Hugging Face's math-verify). The bench prints each
case where the two scorers disagree, which of them is right, and each scorer's accuracy
against the hand labels.

math-verify imports parts of sympy on first use, which can outlast its own 5 s deadline on
a loaded machine; the cases are therefore scored twice and the second pass (what a
long-running reward worker sees) is the one reported, with the cases whose score changed
between the passes listed.

Last line: ``verifiers cases=<N> disagree=<D> hand_acc=<A> math_verify_acc=<B>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CASES = Path(__file__).with_name("verifier_cases.json")


def hand_score(case: dict) -> float:
    from reward_svc.scorers import gsm8k, math_boxed

    scorer = gsm8k if case["style"] == "gsm8k" else math_boxed
    return scorer.compute_score(case["response"], case["truth"])


def verify_score(case: dict) -> float:
    from reward_svc.scorers import math_verify_score

    return math_verify_score.compute_score(case["response"], case["truth"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=str(CASES), help="JSON list of {style, response, truth, right, note}")
    args = p.parse_args()
    cases = json.loads(Path(args.cases).read_text())
    first = [verify_score(c) for c in cases]
    hand, mv = [hand_score(c) for c in cases], [verify_score(c) for c in cases]
    changed = [c["note"] for c, a, b in zip(cases, first, mv) if a != b]
    if changed:
        print(f"math_verify changed its score between passes (first-use deadline) on: {'; '.join(changed)}")
    print(f"{'style':6} {'right':5} {'hand':4} {'m-v':4} {'who is right':12} case")
    disagree = 0
    for c, h, m in zip(cases, hand, mv):
        if (h == 1.0) == (m == 1.0):
            continue
        disagree += 1
        who = "math_verify" if (m == 1.0) == c["right"] else "hand-written"
        print(f"{c['style']:6} {int(c['right']):5} {h:4.0f} {m:4.0f} {who:12} {c['note']}: {c['response']!r} vs {c['truth']!r}")
    acc = lambda scores: sum((s == 1.0) == c["right"] for s, c in zip(scores, cases)) / len(cases)  # noqa: E731
    print(f"verifiers cases={len(cases)} disagree={disagree} hand_acc={acc(hand):.3f} math_verify_acc={acc(mv):.3f}")


if __name__ == "__main__":
    main()
