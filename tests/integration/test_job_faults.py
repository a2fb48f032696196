"""Services that survive each other: real ``meshrl run`` jobs hurt from outside.

Each test starts a real job (embedded broker or Redis, vLLM replicas, reward worker, FSDP2
trainer), signals its services by the pids in ``status.json`` as a user would, and checks
the job completes and its ledger shows nothing lost and nothing trained twice.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.fixtures.jobs import make_arith_parquet
from tests.integration.job_faults_support import REPO, Job, admission_trace, assert_ledger_exact

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(2400)]  # vLLM start-ups dominate; slow on a loaded machine


@pytest.fixture(scope="module")
def arith_data(tmp_path_factory):
    return make_arith_parquet(tmp_path_factory.mktemp("arith"), train_size=96)


def test_killed_replica_reward_worker_and_trainer_are_restarted(tmp_path, tiny_model, arith_data):
    """Two replicas: SIGKILL one, then the reward worker, then the trainer; the job goes on."""
    job = Job(tmp_path / "run", tiny_model, arith_data, "services.rollout.replicas=2", "trainer.total_steps=8").start()
    try:
        job.wait_step(1)
        job.kill("rollout-1")  # the other replica keeps the job going while this one restarts
        job.wait_step(2)
        old = job.kill("reward-0")
        job.wait_back("reward-0", old)
        job.wait_step(3)
        old = job.kill("trainer")
        job.wait_back("trainer", old)
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    status = job.status()
    assert status["state"] == "succeeded", status
    restarts = {name: s["restarts"] for name, s in status["services"].items()}
    assert restarts["rollout-1"] >= 1 and restarts["reward-0"] >= 1 and restarts["trainer"] >= 1, restarts
    out = job.output()
    # rollout-0 is never killed by the test and must never crash; the supervisor may restart it
    # only for lagging the restarted trainer's weights (the version-lag rule, whose message
    # says so): a replica can stay in a dead trainer's weight group (docs/supervision.md)
    assert "rollout-0 exited with code -9; restart" not in out, out[-4000:]
    if restarts["rollout-0"]:
        assert "rollout-0 is stuck (serves policy version" in out, out[-4000:]
    assert "rollout-1 exited with code -9; restart 1/" in out and "trainer exited with code -9" in out
    # whatever died, the feeder never had more than (max_staleness 1 + 1) x batch 4 prompts in flight
    trace = admission_trace(job.run_dir, n=4)
    assert trace and max(trace) <= 8, trace
    assert_ledger_exact(job.run_dir)


def test_one_replica_killed_then_frozen_then_the_job_is_stopped_and_resumed(tmp_path, tiny_model, arith_data):
    """One replica: SIGKILL it (the mesh waits for its restart), SIGSTOP it across a weight
    publication and SIGCONT it, then SIGTERM the job and resume it with the same command."""
    job = Job(tmp_path / "run", tiny_model, arith_data, "trainer.total_steps=6").start()
    try:
        job.wait_step(1)
        old = job.kill("rollout-0")
        job.wait_back("rollout-0", old)
        at = job.wait_step(2)["step"]
        job.kill("rollout-0", signal.SIGSTOP)
        time.sleep(8)  # the trainer publishes meanwhile; the frozen replica must not hold it
        job.kill("rollout-0", signal.SIGCONT)
        st = job.wait_step(at + 1)
        t0 = time.monotonic()
        job.proc.send_signal(signal.SIGTERM)
        assert job.finish(timeout=120) == 130
        stop_s = time.monotonic() - t0
        stopped = job.status()
        assert stopped["state"] == "cancelled", stopped
        assert "DEADLINE_EXCEEDED" not in (job.run_dir / "logs" / "trainer.log").read_text()
        # the step in progress was acked and checkpointed
        ckpt = int((job.run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
        assert ckpt >= st["step"]
        fed_before = json.loads((job.run_dir / "feeder.json").read_text())["state"]["fed"]
        job.start()  # the same command: resume
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    assert job.status()["state"] == "succeeded"
    out = job.output()
    assert f"resuming: {fed_before} prompts fed before" in out
    print(f"SIGTERM stop took {stop_s:.1f}s")
    assert_ledger_exact(job.run_dir)


def test_a_frozen_reward_worker_is_killed_and_restarted(tmp_path, tiny_model, arith_data):
    """SIGSTOP the reward worker (it starts fast) for longer than
    ``services.restart.heartbeat_timeout_s``: alive but silent counts as crashed, so the
    supervisor kills it and starts it again; its leased rollouts are scored by the new one."""
    job = Job(tmp_path / "run", tiny_model, arith_data, "trainer.total_steps=3",
              "services.restart.heartbeat_timeout_s=20").start()
    try:
        # as soon as every service is up: the job cannot train its steps without the samples
        # a reward worker scores from now on (later, async feeding may have scored them all)
        job.wait_for(lambda s: s.get("state") == "running", "the job running")
        old = job.kill("reward-0", signal.SIGSTOP)  # never continued: only the supervisor can end it
        job.wait_back("reward-0", old)
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    status = job.status()
    assert status["state"] == "succeeded", status
    assert status["services"]["reward-0"]["restarts"] == 1, status["services"]
    out = job.output()
    assert "reward-0 is stuck (no heartbeat for" in out, out[-4000:]
    assert "reward-0 exited with code -9 (no heartbeat for" in out and "reward-0 ready again" in out
    assert_ledger_exact(job.run_dir)


def test_a_reward_function_that_raises_or_hangs_scores_zero_and_the_job_trains(tmp_path, tiny_model, arith_data):
    fn = tmp_path / "bad_reward.py"
    fn.write_text(
        "import time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if len(solution_str) % 2:\n"
        "        raise ValueError('this scorer always fails')\n"
        "    time.sleep(3600)\n"
    )
    job = Job(tmp_path / "run", tiny_model, arith_data, "trainer.total_steps=2",
              f"reward.custom_reward_function.path={fn}", "reward.call_timeout_s=1",
              "reward.batch_timeout_s=30", "rollout.ignore_eos=true", "queues.lease_idle_s=120").start()
    try:
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    ledger = assert_ledger_exact(job.run_dir)
    assert ledger["failed"] == ledger["trained"] > 0, ledger


def test_a_corrupt_data_file_is_refused_at_once_with_one_line(tmp_path, tiny_model, arith_data):
    bad = tmp_path / "corrupt.parquet"
    raw = bytearray(arith_data.read_bytes())
    for i in range(8, 200):
        raw[i] ^= 0xFF
    bad.write_bytes(bytes(raw))
    job = Job(tmp_path / "run", tiny_model, bad, "trainer.total_steps=2")
    proc = subprocess.run(job.argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.train_files[0]:" in lines[0] and "not a readable parquet file" in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.redis
def test_a_job_over_redis_survives_a_redis_restart(tmp_path, tiny_model, arith_data, redis_server_aof):
    job = Job(tmp_path / "run", tiny_model, arith_data, "trainer.total_steps=5", "queues.type=redis",
              f"queues.url={redis_server_aof.url}").start()
    try:
        job.wait_step(2)
        redis_server_aof.kill()
        time.sleep(3)
        redis_server_aof.restart()
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    assert job.status()["state"] == "succeeded"
    assert_ledger_exact(job.run_dir)


def test_ppo_with_a_gae_critic_and_a_reference_kl_runs_through_the_mesh(tmp_path, tiny_model, arith_data):
    job = Job(tmp_path / "run", tiny_model, arith_data, "trainer.total_steps=2", "algorithm.adv_estimator=gae",
              "algorithm.off_policy.mode=none", "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=16",
              "actor.use_kl_loss=true", "actor.kl_loss_coef=0.01").start()
    try:
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    history = [json.loads(line) for line in (job.run_dir / "trainer_metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1, 2]
    assert all("critic/vf_loss" in h["metrics"] and "actor/kl_loss" in h["metrics"] for h in history), history[-1]
    assert_ledger_exact(job.run_dir)
