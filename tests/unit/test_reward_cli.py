"""``python -m reward_svc`` configuration loading: its view, strict, nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from services.config.job import JobSpecError
from services.config.views import RewardView, load_view


def load_config(path: str, overrides: list[str]) -> RewardView:
    return load_view(RewardView, path, overrides)  # what python -m reward_svc loads


def test_standalone_file_with_overrides(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({
        "reward": {"tokenizer_path": "/tok", "custom_reward_function": {"path": "f.py", "reward_kwargs": {"a": 1}}},
        "queues": {"type": "redis", "url": "redis://127.0.0.1:1/0"},
    }))
    view = load_config(str(path), ["reward.num_workers=3", "reward.call_timeout_s=2.5", "resources.grpc_port=null"])
    reward = view.reward
    assert (reward.num_workers, reward.call_timeout_s, reward.tokenizer_path) == (3, 2.5, "/tok")
    assert reward.custom_reward_function.reward_kwargs == {"a": 1}
    assert view.queues.type == "redis" and view.resources.grpc_port is None


def test_standalone_errors_name_the_field(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"reward": {"tokenizer_path": "/tok", "num_wrokers": 2}}))
    with pytest.raises(JobSpecError, match="num_wrokers"):
        load_config(str(path), [])
    path.write_text(yaml.safe_dump({"reward": {}}))
    with pytest.raises(JobSpecError, match="tokenizer_path"):
        load_config(str(path), [])
    path.write_text(yaml.safe_dump({"reward": {"tokenizer_path": "/t"}, "extra": 1}))
    with pytest.raises(JobSpecError, match="extra"):
        load_config(str(path), [])


def test_reward_view_of_a_job_spec_and_refusal_of_the_job_itself(tmp_path):
    from services.config.job import parse_job
    from services.config.views import derive_view

    spec = {
        "name": "t",
        "model": {"path": "/models/tiny", "tokenizer_path": "/models/tok"},
        "data": {"train_files": ["x.parquet"], "train_batch_size": 4},
        "actor": {"ppo_mini_batch_size": 4},
        "rollout": {"n": 2},
        "reward": {"num_workers": 4},
    }
    view = derive_view(parse_job(spec, ["reward.memory_limit_mb=1024"]), "reward")
    assert (view.reward.num_workers, view.reward.memory_limit_mb, view.reward.tokenizer_path) == (4, 1024, "/models/tok")
    assert view.queues is not None
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(JobSpecError, match="is a job spec, not a reward view"):
        load_config(str(path), [])


def test_help_is_instant_and_imports_nothing_heavy():
    code = "import sys, runpy; sys.argv=['x','--help']\ntry:\n runpy.run_module('reward_svc', run_name='__main__')\nexcept SystemExit: pass\nassert 'torch' not in sys.modules, 'torch imported by --help'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--config" in out.stdout

