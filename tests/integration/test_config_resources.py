"""The resource keys of a job reach the process that uses them, or are refused naming the key.

Each test cuts a service's view out of a job spec (as ``meshrl run`` / ``meshrl views`` do),
starts the real service on that file, and reads what the process reports in its readiness
line (``services.readiness``): trainer ranks (``services.trainer.nproc``, real gloo ranks),
devices (``services.*.device``) and the dtype (``model.dtype``, ``rollout.dtype``) the
trainer and vLLM really run in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from services.config.job import parse_job
from services.config.views import derive_view, write_view
from services.readiness import OutputWatcher

pytestmark = [pytest.mark.timeout(900)]

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _job(model: str, *overrides: str):
    raw = {"name": "res", "model": {"path": model}, "data": {"train_files": "x.parquet", "train_batch_size": 2,
           "max_prompt_length": 16, "max_response_length": 4},
           "rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2}}  # fmt: skip
    return parse_job(raw, list(overrides))


def _start(module: str, view_path, *args: str) -> tuple[subprocess.Popen, OutputWatcher]:
    env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(view_path), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    return proc, OutputWatcher(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.mark.distributed
def test_trainer_nproc_and_dtype_reach_the_ranks(tiny_model, tmp_path):
    """services.trainer.nproc=2 -> two gloo ranks; model.dtype=bfloat16 -> parameters in bfloat16."""
    job = _job(tiny_model, "services.trainer.nproc=2", "services.trainer.torch_threads=1", "model.dtype=bfloat16",
               "trainer.total_steps=1", f"trainer.default_local_dir={tmp_path / 'ckpt'}")
    view = derive_view(job, "trainer").model_copy(update={"queues": None, "weights": None})  # synthetic batches
    path = write_view(view, tmp_path / "trainer.yaml")
    proc, out = _start("trainer_svc", path)
    try:
        ready = out.wait(600)
        assert (ready.service, ready.info["world_size"], ready.info["device"], ready.info["dtype"]) == \
            ("trainer", 2, "cpu", "bfloat16")
        assert proc.wait(600) == 0, out.text(40)
    finally:
        _stop(proc)


@NO_CUDA
@pytest.mark.parametrize("service, module, says", [
    ("trainer", "trainer_svc", "no CUDA device"),
    ("rollout", "rollout_svc", "this vLLM build runs on cpu"),
])  # fmt: skip
def test_a_cuda_device_this_machine_lacks_is_refused_naming_the_key(tiny_model, tmp_path, service, module, says):
    view = derive_view(_job(tiny_model, f"services.{service}.device=cuda"), service)
    if service == "rollout":  # only the engine start matters: no streams, no weight channel
        view = view.model_copy(update={"queues": None, "weights": None})
    proc, out = _start(module, write_view(view, tmp_path / f"{service}.yaml"))
    try:
        assert proc.wait(300) == 2
        assert f"services.{service}.device" in out.text() and says in out.text()
    finally:
        _stop(proc)


@pytest.mark.vllm
def test_rollout_dtype_reaches_vllm(tiny_model, tmp_path):
    """rollout.dtype (default: model.dtype) is the dtype the engine really loads the model in."""
    view = derive_view(_job(tiny_model, "model.dtype=bfloat16"), "rollout")
    view = view.model_copy(update={"queues": None, "weights": None})
    raw = yaml.safe_load(write_view(view, tmp_path / "rollout.yaml").read_text())
    assert raw["rollout"]["dtype"] == "auto" and raw["model"]["dtype"] == "bfloat16"
    proc, out = _start("rollout_svc", tmp_path / "rollout.yaml", "--id", "dtype-probe", "rollout.max_num_seqs=4")
    try:
        ready = out.wait(600)
        assert (ready.service, ready.id, ready.info["device"], ready.info["dtype"]) == \
            ("rollout", "dtype-probe", "cpu", "bfloat16")
    finally:
        _stop(proc)


def _cpus_allowed(pid: int) -> str:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for tid in os.listdir(f"/proc/{p}/task"):
            try:
                kids = open(f"/proc/{p}/task/{tid}/children").read().split()
            except OSError:
                continue
            out += [int(k) for k in kids]
            todo += [int(k) for k in kids]
    return out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning to one CPU of several needs two CPUs")
def test_services_cpus_pins_the_service_and_what_it_starts(tiny_model, tmp_path):
    """services.reward.cpus=<one CPU> -> the reward process and its sandbox workers run only there."""
    cpu = str(max(os.sched_getaffinity(0)))
    view = derive_view(_job(tiny_model, f"services.reward.cpus={cpu}", "reward.num_workers=2",
                                    "reward.isolate_builtin=true"), "reward")
    proc, out = _start("reward_svc", write_view(view, tmp_path / "reward.yaml"), "--no-queue")
    try:
        out.wait(300)
        pids = [proc.pid, *_descendants(proc.pid)]
        assert len(pids) >= 3, out.text(40)  # the service and its two sandbox workers
        assert {_cpus_allowed(p) for p in pids} == {cpu}
    finally:
        _stop(proc)


def test_cpus_this_machine_does_not_have_are_refused_naming_the_key(tiny_model, tmp_path):
    view = derive_view(_job(tiny_model, "services.reward.cpus=4000-4001"), "reward")
    proc, out = _start("reward_svc", write_view(view, tmp_path / "reward.yaml"), "--no-queue")
    try:
        assert proc.wait(120) == 2
        assert "services.reward.cpus='4000-4001'" in out.text() and "not available" in out.text()
    finally:
        _stop(proc)
