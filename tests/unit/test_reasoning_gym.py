"""reasoning-gym tasks: rows written by ``meshrl make-dataset reasoning-gym:...`` and scored
by each task's own verifier through the built-in dispatcher (real reasoning-gym)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from reward_svc.scorers import default_compute_score, find_scorer, reasoning_gym_score
from services.data import reasoning_tasks as rt


def _answer(row: dict) -> str:
    return json.loads(row["reward_model"]["ground_truth"])["entry"]["answer"]


def test_mixed_tasks_are_shared_evenly_and_interleaved() -> None:
    rows = rt.task_rows(["chain_sum", "leg_counting", "basic_arithmetic"], 7, 3, "train")
    sources = [r["data_source"] for r in rows]
    assert sources[:3] == ["reasoning_gym/chain_sum", "reasoning_gym/leg_counting", "reasoning_gym/basic_arithmetic"]
    assert [sources.count(f"reasoning_gym/{t}") for t in ("chain_sum", "leg_counting", "basic_arithmetic")] == [3, 2, 2]
    assert [r["extra_info"]["index"] for r in rows] == list(range(7))
    assert rt.task_rows(["chain_sum"], 4, 3, "train") == rt.task_rows(["chain_sum"], 4, 3, "train")  # seeded


def test_every_row_scores_one_with_its_answer_and_zero_with_a_wrong_one() -> None:
    rows = rt.task_rows(["chain_sum", "leg_counting", "basic_arithmetic", "simple_equations"], 12, 0, "train")
    for r in rows:
        truth = r["reward_model"]["ground_truth"]
        assert default_compute_score(r["data_source"], _answer(r), truth) == 1.0
        assert default_compute_score(r["data_source"], f"Let me think.\n<answer>{_answer(r)}</answer>", truth) == 1.0
        assert default_compute_score(r["data_source"], "<answer>no idea</answer>", truth) == 0.0


def test_the_task_verifier_decides_not_a_string_match() -> None:
    [row] = rt.task_rows(["chain_sum"], 1, 5, "train", {"chain_sum": {"max_terms": 2, "max_digits": 2}})
    truth, answer = row["reward_model"]["ground_truth"], _answer(row)
    # chain_sum's verifier reads numbers: "+0012" style formatting still equals the answer
    assert default_compute_score(row["data_source"], f"{int(answer):+05d}", truth) == 1.0
    # the default verifier of other tasks gives partial credit for the answer inside a longer text
    [legs] = rt.task_rows(["leg_counting"], 1, 5, "train")
    text = f"The total is {_answer(legs)}"
    assert default_compute_score(legs["data_source"], text, legs["reward_model"]["ground_truth"]) == pytest.approx(
        len(_answer(legs)) / len(text))


def test_configs_reach_the_generator() -> None:
    configs = rt.parse_configs(["chain_sum.max_terms=2", "chain_sum.min_digits=2", "chain_sum.max_digits=2"], ["chain_sum"])
    assert configs == {"chain_sum": {"max_terms": 2, "min_digits": 2, "max_digits": 2}}
    for r in rt.task_rows(["chain_sum"], 20, 0, "train", configs):
        expr = json.loads(r["reward_model"]["ground_truth"])["entry"]["metadata"]["expression"]
        terms = expr.replace("-", "+").split("+")
        assert len(terms) == 2 and all(10 <= int(t) <= 99 for t in terms), expr


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: rt.parse_tasks("chain_sum"), "reasoning-gym:<task>"),
        (lambda: rt.parse_tasks("reasoning-gym:"), "names no task"),
        (lambda: rt.parse_tasks("reasoning-gym:chain_sums"), "did you mean 'chain_sum'"),
        (lambda: rt.parse_tasks("reasoning-gym:chain_sum,chain_sum"), "twice"),
        (lambda: rt.parse_configs(["chain_sum.max_terms"], ["chain_sum"]), "TASK.FIELD=VALUE"),
        (lambda: rt.parse_configs(["leg_counting.x=1"], ["chain_sum"]), "not among"),
        (lambda: rt.parse_configs(["chain_sum.seed=1"], ["chain_sum"]), "--size/--seed"),
        (lambda: rt.task_rows(["chain_sum"], 2, 0, "train", {"chain_sum": {"max_terms": 0}}), "rejects config"),
        (lambda: rt.task_rows(["chain_sum", "leg_counting"], 1, 0, "train"), "below the number of tasks"),
    ],
)
def test_bad_specs_are_refused_with_the_reason(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_held_out_drops_train_questions() -> None:
    train = rt.task_rows(["chain_sum"], 30, 0, "train", {"chain_sum": {"max_terms": 2, "max_digits": 1}})
    test = rt.task_rows(["chain_sum"], 30, rt.test_seed(0, 30), "test", {"chain_sum": {"max_terms": 2, "max_digits": 1}})
    kept = rt.held_out(test, train)
    seen = {r["prompt"][0]["content"] for r in train}
    assert kept and all(r["prompt"][0]["content"] not in seen for r in kept)
    assert [r["extra_info"]["index"] for r in kept] == list(range(len(kept)))
    with pytest.raises(ValueError, match="every test question"):
        rt.held_out(train, train)


def test_scorer_families_and_bad_ground_truth() -> None:
    assert find_scorer("reasoning_gym/anything") is reasoning_gym_score.compute_score
    assert find_scorer("reasoning_gym/") is None and find_scorer("reasoning_gym") is None
    assert find_scorer("math_verify/gsm8k") is find_scorer("math_verify") is not None
    assert find_scorer("nope/x") is None
    with pytest.raises(ValueError, match="JSON"):
        reasoning_gym_score.compute_score("1", json.dumps({"answer": "1"}))
    assert reasoning_gym_score.extract_answer("a <answer> 7 </answer> b <answer>8</answer>") == "8"
    assert reasoning_gym_score.extract_answer("  just 8\n") == "just 8"
    assert reasoning_gym_score.extract_answer("3 - 7 = -4, so 1,204.5.", "last_number") == "1204.5"
    assert reasoning_gym_score.extract_answer("none", "last_number") == ""
    assert reasoning_gym_score.extract_answer("<answer>x</answer> 5", "last_number") == "x"
    with pytest.raises(ValueError, match="extract"):
        reasoning_gym_score.extract_answer("5", "first")


def test_last_number_extraction_reaches_the_verifier() -> None:
    [row] = rt.task_rows(["chain_sum"], 1, 5, "train", {"chain_sum": {"max_terms": 2, "max_digits": 1}})
    truth, answer = row["reward_model"]["ground_truth"], _answer(row)
    text = f"The answer to this problem is {answer}."
    assert default_compute_score(row["data_source"], text, truth) < 0.1  # the whole response is no number
    assert default_compute_score(row["data_source"], text, truth, extract="last_number") == 1.0


def test_cli_writes_train_and_test_that_validate(tmp_path: Path) -> None:
    out = tmp_path / "rg"
    r = subprocess.run([sys.executable, "-m", "meshrl_cli", "make-dataset", "reasoning-gym:chain_sum,leg_counting",
                        str(out), "--size", "10", "--test-size", "4", "--seed", "2", "--config", "chain_sum.max_terms=2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from services.config.names import data_sources

    for split, n in (("train", 10), ("test", 4)):
        assert data_sources([str(out / f"{split}.parquet")]) == {"reasoning_gym/chain_sum", "reasoning_gym/leg_counting"}
        import pyarrow.parquet as pq

        assert pq.read_table(out / f"{split}.parquet").num_rows == n
    bad = subprocess.run([sys.executable, "-m", "meshrl_cli", "make-dataset", "arith", str(tmp_path / "a"),
                          "--config", "chain_sum.max_terms=2"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--config and --instruction are for reasoning-gym" in bad.stderr


def test_the_registry_declares_the_scorer_families() -> None:
    """``meshrl validate`` knows the families without importing reward_svc."""
    from reward_svc.scorers import SCORER_FAMILIES
    from services import registry

    assert sorted(registry.SCORER_FAMILIES) == sorted(SCORER_FAMILIES)
    assert registry.scorer_family("reasoning_gym/chain_sum") == "reasoning_gym/"
    assert registry.scorer_family("reasoning_gym/") is None and registry.scorer_family("gsm8k") is None
