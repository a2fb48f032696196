"""reasoning-gym tasks, scored by each task's own verifier (``score_answer``).

The data source is ``reasoning_gym/<task>`` and the ground truth the JSON that
``meshrl make-dataset reasoning-gym:...`` stores (``services.data.reasoning_tasks``):
``{"task", "config", "entry": {"question", "answer", "metadata"}}``. The answer handed to
the verifier is the content of the last ``<answer>...</answer>`` of the response when it has
one (the format reasoning-gym's own prompts ask for), else (``extract="response"``, the
default) the whole response, stripped, or (``extract="last_number"``, set with
``reward.custom_reward_function.reward_kwargs``) the last number in the response, as verl's
"flexible" GSM8K rule reads one: then "The answer is 7." answers 7, for tasks whose answer is
a number and a policy that does not use the tags.

Scores are the task's: 1.0 for a right answer, partial credit where the task gives it (the
default verifier gives ``len(answer) / len(response)`` when the right answer is inside a
longer response), 0.0 otherwise. One dataset object per (task, config) is built once and
kept; only its ``score_answer`` is used.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Literal

from reward_svc.scorers._extract import clip_tail, last_tag

#: a response is cut to its last this-many characters first (answers come last)
CLIP_CHARS = 4000
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@lru_cache(maxsize=256)
def _dataset(task: str, config_json: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=1, seed=0, **json.loads(config_json))


def extract_answer(solution_str: str, extract: Literal["response", "last_number"] = "response") -> str:
    """The last ``<answer>`` content, else the whole (clipped) response or its last number
    (``""`` when it has none); stripped."""
    if extract not in ("response", "last_number"):
        raise ValueError(f"extract must be 'response' or 'last_number', got {extract!r}")
    text = clip_tail(solution_str, CLIP_CHARS)
    tagged = last_tag(text, "answer")
    if tagged is not None:
        return tagged.strip()
    if extract == "last_number":
        numbers = _NUMBER_RE.findall(text)
        return numbers[-1].replace(",", "") if numbers else ""
    return text.strip()


def compute_score(solution_str: str, ground_truth: object,
                  extract: Literal["response", "last_number"] = "response") -> float:
    """The task's ``score_answer`` of the response's answer (see module doc)."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(truth, dict) or not {"task", "entry"} <= set(truth):
        raise ValueError("reasoning_gym ground truth must be the JSON {task, config, entry} that "
                         "`meshrl make-dataset reasoning-gym:...` writes")
    ds = _dataset(str(truth["task"]), json.dumps(truth.get("config") or {}, sort_keys=True))
    return float(ds.score_answer(extract_answer(solution_str, extract), truth["entry"]))
