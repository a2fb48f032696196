"""verl-style custom reward function loading (file path or module + name)."""

from __future__ import annotations

import pytest

from reward_svc.loader import RewardFunctionLoadError, load_function


def test_load_from_file_path(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text("def my_fn(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                 "    return float(solution_str == ground_truth) + bonus\n")
    fn = load_function(str(f), "my_fn")
    assert fn("x", "a", "a") == 1.0
    assert fn("x", "a", "b", bonus=0.5) == 0.5


def test_load_from_module_name():
    fn = load_function("reward_svc.scorers", "default_compute_score")
    assert fn("openai/gsm8k", "#### 3", "3") == 1.0


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(RewardFunctionLoadError, match="does not exist"):
        load_function(str(tmp_path / "missing.py"))
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('no import for you')\n")
    with pytest.raises(RewardFunctionLoadError, match="no import for you"):
        load_function(str(bad))
    ok = tmp_path / "ok.py"
    ok.write_text("compute_score = 3\n")
    with pytest.raises(RewardFunctionLoadError, match="not callable"):
        load_function(str(ok))
    with pytest.raises(RewardFunctionLoadError, match="'nope' not found"):
        load_function(str(ok), "nope")
    with pytest.raises(RewardFunctionLoadError, match="no_such_module_xyz"):
        load_function("no_such_module_xyz", "f")
