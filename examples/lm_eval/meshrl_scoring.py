"""lm-eval ``process_results`` for tasks written by ``write_tasks.py``: meshrl's built-in
scorer of the row's ``data_source`` (a reasoning-gym task's own verifier, math_verify, ...),
so lm-eval and meshrl's validation score an answer the same way (with the job's
``reward_kwargs``, stored in each row). Needs meshrl importable."""

from __future__ import annotations

import json


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    from reward_svc.scorers import default_compute_score

    kwargs = json.loads(doc.get("scorer_kwargs") or "{}")
    score = float(default_compute_score(doc["data_source"], results[0], doc["ground_truth"], **kwargs))
    return {"score": score, "exact": float(score == 1.0)}
