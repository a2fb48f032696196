"""Datasets: verl-style parquet rows, the synthetic tasks, verl's truncation rules."""

import json

import pytest

from services.data import synthetic
from services.data.files import read_rows
from services.data.parquet import write_rows
from services.data.prompts import PromptTooLongError, truncate_ids


def test_arith_rows_are_verl_rows_with_correct_answers():
    rows = synthetic.arith_rows(50, seed=3, max_operand=9, ops="+-*")
    assert len(rows) == 50
    for r in rows:
        assert r["data_source"] == "meshrl/arith"
        assert r["prompt"][0]["role"] == "user"
        a, b, op = (r["extra_info"][k] for k in ("a", "b", "op"))
        assert r["prompt"][0]["content"] == f"{a}{op}{b}="
        assert int(r["reward_model"]["ground_truth"]) == {"+": a + b, "-": a - b, "*": a * b}[op]


def test_synthetic_is_deterministic_per_seed():
    assert synthetic.arith_rows(5, seed=1) == synthetic.arith_rows(5, seed=1)
    assert synthetic.arith_rows(5, seed=1) != synthetic.arith_rows(5, seed=2)


def test_countdown_targets_are_reachable_with_given_numbers():
    for r in synthetic.countdown_rows(20, seed=0):
        gt = json.loads(r["reward_model"]["ground_truth"])
        assert set(gt) == {"target", "numbers"} and len(gt["numbers"]) == 3
        assert str(gt["target"]) in r["prompt"][0]["content"]


@pytest.mark.parametrize("bad", [dict(n=0), dict(n=3, ops="/"), dict(n=3, max_operand=0)])
def test_arith_rejects_bad_parameters(bad):
    with pytest.raises(ValueError):
        synthetic.arith_rows(**bad)


def test_parquet_round_trip(tmp_path):
    rows = synthetic.arith_rows(7, seed=0)
    write_rows(rows, tmp_path / "a.parquet")
    assert read_rows(tmp_path / "a.parquet") == rows


def test_parquet_missing_column_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="data_source"):
        read_rows(tmp_path / "bad.parquet")


@pytest.mark.parametrize(
    "mode,expected",
    [("left", [4, 5, 6, 7]), ("right", [0, 1, 2, 3]), ("middle", [0, 1, 6, 7])],
)
def test_truncation_modes(mode, expected):
    assert truncate_ids(list(range(8)), 4, mode) == expected


def test_truncation_middle_odd_budget_keeps_more_tail():
    assert truncate_ids(list(range(10)), 5, "middle") == [0, 1, 7, 8, 9]


def test_truncation_error_and_short_prompts():
    assert truncate_ids([1, 2], 4, "error") == [1, 2]
    with pytest.raises(PromptTooLongError, match="longer than max_prompt_length=2"):
        truncate_ids([1, 2, 3], 2, "error")


def test_arith_chains_carry_a_worked_solution_whose_last_integer_is_the_answer():
    from reward_svc.scorers import arith
    from services.data.synthetic import arith_rows

    rows = arith_rows(50, seed=3, max_operand=4, ops="+-", terms=4)
    for r in rows:
        expr = r["prompt"][0]["content"].removesuffix("=")
        truth = r["reward_model"]["ground_truth"]
        assert str(eval(expr)) == truth  # noqa: S307 - our own generated "1+2-3" strings
        sol = r["extra_info"]["solution"]
        assert len(sol.split(",")) == 3
        assert arith.compute_score(sol, truth) == 1.0
    # two terms: the rows the quick start has always used, no solution
    assert "solution" not in arith_rows(5, seed=0, max_operand=4, ops="+")[0]["extra_info"]
    with pytest.raises(ValueError, match="terms"):
        arith_rows(5, terms=1)
