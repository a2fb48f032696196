"""The trainer's entry point and view: parsed before torch, strict, refuses a job spec."""

from __future__ import annotations

import subprocess
import sys

import yaml

from services.config.job import parse_job
from services.config.views import derive_view


def _run(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "trainer_svc", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_help_and_config_loading_do_not_import_torch(tmp_path):
    assert _run("--help").returncode == 0
    cfg = tmp_path / "t.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": "/m"}, "data": {"train_batch_size": 4},
                                   "actor": {"ppo_mini_batch_size": 2}}))
    probe = _run(code=(
        "import sys, argparse; import trainer_svc.__main__; from services.entrypoint import load_view_or_exit; "
        "from services.config.views import TrainerView; "
        f"a = argparse.Namespace(config={str(cfg)!r}, overrides=['actor.optim.lr=0.5', 'trainer.total_steps=7']); "
        "s = load_view_or_exit(TrainerView, a, 'trainer'); "
        "print(s.actor.optim.lr, s.trainer.total_steps, 'torch' in sys.modules)"
    ))
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["0.5", "7", "False"]


def test_bad_config_fails_fast_naming_the_field(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": "/m"}, "data": {"train_batch_size": 4},
                                   "actor": {"clip_ratoi": 0.2}}))
    res = _run("--config", str(cfg))
    assert res.returncode == 2
    assert "actor.clip_ratoi" in res.stderr
    res = _run("--config", str(cfg), "actor.clip_ratoi=null", "actor.ppo_epochs=0")
    assert res.returncode == 2 and "actor.ppo_epochs" in res.stderr


def test_trainer_view_of_a_job_spec(tmp_path):
    job = parse_job({
        "name": "t", "model": {"path": "/m", "dtype": "bfloat16"},
        "data": {"train_files": ["x.parquet"], "train_batch_size": 8},
        "rollout": {"n": 4, "temperature": 0.7}, "async": {"max_staleness": 2},
        "actor": {"ppo_mini_batch_size": 4, "kl_loss_type": "k3"},
        "services": {"trainer": {"nproc": 2, "torch_threads": 3}},
        "queues": {"type": "redis", "url": "redis://127.0.0.1:1/0"},
    })
    spec = derive_view(job, "trainer")
    assert (spec.data.train_batch_size, spec.rollout.n, spec.async_.max_staleness) == (8, 4, 2)
    assert spec.rollout.temperature == 0.7 and spec.model.dtype == "bfloat16"
    assert spec.actor.ppo_mini_batch_size == 4 and spec.actor.kl_loss_type == "k3"
    assert (spec.resources.nproc, spec.resources.torch_threads, spec.resources.device) == (2, 3, "cpu")
    assert spec.queues.type == "redis" and spec.weights is not None


def test_trainer_refuses_a_job_spec_naming_what_to_do(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "t", "model": {"path": "/m"},
                                   "data": {"train_files": ["x.parquet"], "train_batch_size": 8}}))
    res = _run("--config", str(job))
    assert res.returncode == 2 and "is a job spec, not a trainer view" in res.stderr and "meshrl views" in res.stderr
