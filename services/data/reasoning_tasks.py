"""Tasks from reasoning-gym (procedural generators with their own verifiers) as verl rows.

``meshrl make-dataset reasoning-gym:chain_sum,leg_counting DIR --size N --seed S`` writes
``DIR/train.parquet`` and ``DIR/test.parquet``. Each row is one generated entry:

    data_source   "reasoning_gym/<task>"      validation reports each task on its own
    prompt        [{"role": "user", "content": <the entry's question>[ + " " + instruction]}]
    ability       "reasoning"
    reward_model  {"style": "rule", "ground_truth": <JSON, below>}
    extra_info    {"split", "index", "task"}

The ground truth carries everything the task's own ``score_answer(answer, entry)`` needs,
so the reward worker scores without regenerating anything: ``{"task", "config", "entry":
{"question", "answer", "metadata"}}`` (``config``: the generator settings other than size
and seed, with which the scorer builds its dataset object). Every row is checked when it is
written: its stored entry, read back from JSON, must score 1.0 with its own answer, so a
task whose entries do not survive JSON fails here, not as zero rewards during training.

Several tasks share the rows evenly (the first ``size % k`` tasks get one more) and are
interleaved, so every batch mixes them. reasoning-gym draws entry ``i`` from a generator
seeded with ``seed + i``, so the test split starts at ``seed + size`` (:func:`test_seed`),
where the train split's seeds end, and also loses any question the train split has (a
small task repeats questions); all of this runs on this machine (reasoning-gym generates,
nothing is downloaded).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

PREFIX = "reasoning-gym:"
SOURCE_PREFIX = "reasoning_gym/"


def parse_tasks(spec: str) -> list[str]:
    """``"reasoning-gym:a,b"`` -> ``["a", "b"]``, each a task reasoning-gym knows."""
    if not spec.startswith(PREFIX):
        raise ValueError(f"a reasoning-gym dataset is named {PREFIX}<task>[,<task>...], got {spec!r}")
    tasks = [t.strip() for t in spec[len(PREFIX):].split(",") if t.strip()]
    if not tasks:
        raise ValueError(f"{spec!r} names no task: {PREFIX}<task>[,<task>...]")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"{spec!r} names a task twice")
    from reasoning_gym.factory import DATASETS

    from services.config.names import did_you_mean

    for t in tasks:
        if t not in DATASETS:
            raise ValueError(f"unknown reasoning-gym task {t!r}{did_you_mean(t, DATASETS)}")
    return tasks


def parse_configs(items: Sequence[str], tasks: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["chain_sum.max_terms=2", ...]`` -> ``{"chain_sum": {"max_terms": 2}}`` (YAML values)."""
    import yaml

    out: dict[str, dict[str, Any]] = {t: {} for t in tasks}
    for item in items:
        key, sep, value = item.partition("=")
        task, dot, field = key.partition(".")
        if not sep or not dot or not field:
            raise ValueError(f"--config {item!r}: expected TASK.FIELD=VALUE, e.g. chain_sum.max_terms=2")
        if task not in out:
            raise ValueError(f"--config {item!r}: task {task!r} is not among {', '.join(tasks)}")
        if field in ("size", "seed"):
            raise ValueError(f"--config {item!r}: set {field} with --size/--seed")
        out[task][field] = yaml.safe_load(value)
    return out


def test_seed(seed: int, train_size: int) -> int:
    """The test split's seed: past every seed the train split used (see module doc)."""
    return seed + train_size


def _shares(size: int, k: int) -> list[int]:
    return [size // k + (1 if i < size % k else 0) for i in range(k)]


def _entries(task: str, n: int, seed: int, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    import reasoning_gym

    try:
        ds = reasoning_gym.create_dataset(task, size=n, seed=seed, **config)
    except (TypeError, AssertionError, ValueError) as exc:
        raise ValueError(f"reasoning-gym task {task!r} rejects config {dict(config)}: {exc}") from None
    out = []
    for i in range(n):
        e = ds[i]
        entry = json.loads(json.dumps({"question": e["question"], "answer": e["answer"],
                                       "metadata": e.get("metadata", {})}, default=_plain))
        score = ds.score_answer(entry["answer"], entry)
        if score != 1.0:
            raise ValueError(f"reasoning-gym task {task!r}: entry {i} scores {score} with its own answer once stored "
                             "as JSON; this task cannot be scored from the dataset file")
        out.append(entry)
    return out


def _plain(value: Any) -> Any:
    """JSON for what reasoning-gym puts in metadata beyond JSON's types (sets, tuples, numpy)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} in reasoning-gym metadata is not JSON")


def task_rows(tasks: Sequence[str], size: int, seed: int, split: str,
              configs: Mapping[str, Mapping[str, Any]] | None = None, instruction: str = "") -> list[dict[str, Any]]:
    """``size`` rows shared by ``tasks`` and interleaved (see module doc). ``instruction``
    is appended to every question (how to give the answer, e.g. "Answer with just the
    number."); the entry the verifier sees keeps the task's own question."""
    if size < len(tasks):
        raise ValueError(f"--size {size} is below the number of tasks ({len(tasks)})")
    configs = configs or {}
    per_task = [_entries(t, n, seed, configs.get(t, {})) for t, n in zip(tasks, _shares(size, len(tasks)))]
    rows: list[dict[str, Any]] = []
    for j in range(max(len(p) for p in per_task)):
        for task, entries in zip(tasks, per_task):
            if j < len(entries):
                rows.append(_row(task, entries[j], dict(configs.get(task, {})), split, len(rows), instruction))
    return rows


def _row(task: str, entry: dict[str, Any], config: dict[str, Any], split: str, index: int,
         instruction: str) -> dict[str, Any]:
    truth = json.dumps({"task": task, "config": config, "entry": entry}, sort_keys=True)
    question = entry["question"].rstrip()
    return {
        "data_source": SOURCE_PREFIX + task,
        "prompt": [{"role": "user", "content": f"{question} {instruction.strip()}" if instruction.strip() else question}],
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "task": task},
    }


def held_out(test: list[dict[str, Any]], train: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``test`` without the questions ``train`` has (re-indexed)."""
    seen = {r["prompt"][0]["content"] for r in train}
    kept = [r for r in test if r["prompt"][0]["content"] not in seen]
    if not kept:
        raise ValueError("every test question is also a train question (the task has too few distinct questions "
                         "for this --size); lower --size or widen the task's config")
    for i, r in enumerate(kept):
        r["extra_info"] = {**r["extra_info"], "index": i}
    return kept
