r"""Convert the usual public layouts of math datasets into verl's row schema (locally).

``gsm8k``: records with ``question`` and ``answer``, the answer's last line being
``#### <number>`` (the GSM8K layout). The ground truth is that number without thousands
separators; the data source ``openai/gsm8k`` selects the ``#### N`` scorer.

``math``: records with ``problem`` and ``solution`` holding a ``\boxed{...}`` answer (the
MATH / MATH-lighteval layout; an ``answer`` column, as in MATH-500, is used when present).
The ground truth is the content of the last ``\boxed{}``; data source ``lighteval/MATH``
selects the boxed-answer scorer.

Nothing is downloaded: :func:`convert_file` reads a local file or saved dataset directory
(any format of :mod:`services.data.files`). A record that does not fit the layout is an
error naming its index, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.data.files import DataFileError, read_records

GSM8K_SOURCE = "openai/gsm8k"
MATH_SOURCE = "lighteval/MATH"
GSM8K_INSTRUCTION = 'Think it through step by step, then give the final answer on its own line after "####".'
MATH_INSTRUCTION = r"Reason step by step and write the final answer inside \boxed{}."


def gsm8k_answer(answer: str) -> str:
    """The number after the last ``####`` of a GSM8K answer (thousands separators removed)."""
    head, sep, tail = answer.rpartition("####")
    if not sep:
        raise ValueError("no '#### <answer>' line")
    value = tail.strip().splitlines()[0].strip() if tail.strip() else ""
    if not value:
        raise ValueError("nothing after '####'")
    return value.replace(",", "").rstrip(".")


def last_boxed(text: str) -> str:
    r"""The content of the last ``\boxed{...}`` (balanced braces) in ``text``."""
    start = text.rfind("\\boxed")
    if start < 0:
        raise ValueError("no \\boxed{...} answer")
    i = start + len("\\boxed")
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        raise ValueError("\\boxed without braces")
    depth, j = 0, i
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            break
    if depth:
        raise ValueError("unbalanced braces in \\boxed{...}")
    return text[i + 1 : j].strip()


def _need(rec: dict[str, Any], *keys: str) -> list[str]:
    missing = [k for k in keys if not isinstance(rec.get(k), str)]
    if missing:
        raise ValueError(f"missing text column(s) {missing} (has {sorted(rec)})")
    return [rec[k] for k in keys]


def gsm8k_row(rec: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    question, answer = _need(rec, "question", "answer")
    return {
        "data_source": GSM8K_SOURCE,
        "prompt": [{"role": "user", "content": f"{question.strip()} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gsm8k_answer(answer)},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def math_row(rec: dict[str, Any], index: int, split: str) -> dict[str, Any]:
    (problem,) = _need(rec, "problem")
    solution = rec.get("solution") if isinstance(rec.get("solution"), str) else ""
    given = rec.get("answer")
    truth = given.strip() if isinstance(given, str) and given.strip() else last_boxed(solution)
    extra = {"split": split, "index": index}
    for k in ("level", "type", "subject", "unique_id"):
        if k in rec and isinstance(rec[k], (str, int)):
            extra[k] = rec[k]
    return {
        "data_source": MATH_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem.strip()} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra,
    }


CONVERTERS: dict[str, Callable[[dict[str, Any], int, str], dict[str, Any]]] = {"gsm8k": gsm8k_row, "math": math_row}


def convert_records(kind: str, records: list[dict[str, Any]], split: str, *, where: str = "") -> list[dict[str, Any]]:
    """verl rows of ``records`` in layout ``kind`` (gsm8k|math); the first misfit raises."""
    conv = CONVERTERS.get(kind)
    if conv is None:
        raise ValueError(f"unknown layout {kind!r}; expected one of {sorted(CONVERTERS)}")
    rows = []
    for i, rec in enumerate(records):
        try:
            rows.append(conv(rec, i, split))
        except ValueError as exc:
            raise DataFileError(f"{where or 'input'}: record {i} is not in the {kind} layout: {exc}") from None
    if not rows:
        raise DataFileError(f"{where or 'input'}: no records")
    return rows


def convert_file(kind: str, src: str | Path, split: str) -> list[dict[str, Any]]:
    """Read ``src`` (a local file or saved dataset directory) and convert it (see module doc)."""
    return convert_records(kind, read_records(src), split, where=str(src))
