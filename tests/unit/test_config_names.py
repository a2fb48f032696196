"""Registry names in a job spec are checked with "did you mean", and ``meshrl validate``
reports them (and every other failure) in one line each, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.config.job import load_job
from services.config.names import did_you_mean, name_problems
from services.data import synthetic
from services.data.parquet import write_rows

SPEC = str(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")


@pytest.fixture()
def inputs(tmp_path, tiny_model):
    write_rows(synthetic.arith_rows(4, seed=0), tmp_path / "train.parquet")
    odd = synthetic.arith_rows(2, seed=1)
    for r in odd:
        r["data_source"] = "meshrl/arth"
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in odd))
    return [f"model.path={tiny_model}", f"data.train_files={tmp_path / 'train.parquet'}",
            f"data.val_files={tmp_path / 'val.jsonl'}"]


def test_did_you_mean():
    assert did_you_mean("grpoo", ["grpo", "gae"]) == " (did you mean 'grpo'?; known: gae, grpo)"
    assert did_you_mean("zzz", ["grpo", "gae"]) == " (known: gae, grpo)"


def test_unknown_names_are_each_one_line_with_a_suggestion(inputs):
    spec = load_job(SPEC, [*inputs, "algorithm.adv_estimator=grpoo", "actor.policy_loss.loss_mode=vanila"])
    problems = name_problems(spec)
    assert problems[0].startswith("algorithm.adv_estimator: unknown advantage estimator 'grpoo' (did you mean 'grpo'?")
    assert problems[1].startswith("actor.policy_loss.loss_mode: unknown policy loss 'vanila' (did you mean 'vanilla'?")
    assert problems[2].startswith("data.val_files: data_source 'meshrl/arth' has no built-in scorer")
    assert "did you mean 'meshrl/arith'?" in problems[2]
    assert len(problems) == 3


def test_a_good_spec_has_no_name_problems(inputs):
    spec = load_job(SPEC, [*inputs[:2], "data.val_files=[]"])
    assert name_problems(spec) == []


def _meshrl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "meshrl_cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_validate_cli_reports_names_and_never_a_traceback(inputs, tmp_path):
    r = _meshrl("validate", SPEC, *inputs, "algorithm.adv_estimator=grpoo")
    assert r.returncode == 2 and "did you mean 'grpo'?" in r.stderr and "Traceback" not in r.stderr
    r = _meshrl("validate", str(tmp_path))  # a directory, not a spec file
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = _meshrl("validate", str(tmp_path), "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_scorer_families_cover_every_name_of_the_family(tmp_path, tiny_model):
    """``reasoning_gym/<task>`` and ``math_verify/<name>`` sources have a built-in scorer;
    a near miss of the family gets a suggestion."""
    rows = synthetic.arith_rows(3, seed=0)
    for r, src in zip(rows, ("reasoning_gym/chain_sum", "math_verify/gsm8k", "math_verify")):
        r["data_source"] = src
    write_rows(rows, tmp_path / "train.parquet")
    rows[0]["data_source"] = "reasoning-gym/chain_sum"
    write_rows(rows[:1], tmp_path / "val.parquet")
    spec = load_job(SPEC, [f"model.path={tiny_model}", f"data.train_files={tmp_path / 'train.parquet'}",
                           f"data.val_files={tmp_path / 'val.parquet'}"])
    [problem] = name_problems(spec)
    assert problem.startswith("data.val_files: data_source 'reasoning-gym/chain_sum' has no built-in scorer")
    assert "did you mean 'reasoning_gym/<name>'?" in problem
