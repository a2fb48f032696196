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
from tests.integration.job_faults_support import (REPO, Job, admission_trace, assert_ledger_exact,
                                                  first_versions_after_restarts, served_versions)

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(2400)]  # vLLM start-ups dominate; slow on a loaded machine


@pytest.fixture(scope="module")
def arith_data(tmp_path_factory):
    return make_arith_parquet(tmp_path_factory.mktemp("arith"), train_size=96)


#: (async.max_staleness 1 + 1) x data.train_batch_size 4: prompts in flight at most
LIMIT = 8


def _kill_trainer_when(job: Job, line: str, service: str = "rollout-0", timeout: float = 60.0) -> int:
    """SIGKILL the trainer (and its ranks) as soon as ``service``'s log shows ``line`` once more
    than now (or after ``timeout`` s anyway); returns the trainer's pid."""
    seen = job.log(service).count(line)
    deadline = time.monotonic() + timeout
    while job.log(service).count(line) <= seen and time.monotonic() < deadline:
        time.sleep(0.01)
    return job.kill_tree("trainer")


def test_services_killed_again_and_again_and_the_whole_job_killed_during_a_trainer_restart(tmp_path, tiny_model,
                                                                                          arith_data):
    """Two replicas. SIGSTOP the reward worker and never continue it (alive but silent: the
    supervisor kills and restarts it); then the trainer (launcher and ranks) at different moments: as a step ends (the next batch being taken), while it publishes a
    version (a replica has begun loading it), as soon as it is back (the replicas are
    catching up from its snapshot), and once with rollout-1 killed while it restarts; then
    the whole job (its process group) while the trainer restarts, resumed with the same
    command. (Nothing waits for a replica to come back: on a loaded machine a vLLM start
    outlasts the whole job.) The replica never killed follows every restarted trainer (no
    weight group fails to form, no version-lag restart), the feeder never has more than its
    limit in flight (replayed from the broker's file), and the ledger is exact."""
    # 60 steps: more than the kills below can use up however fast the machine (30 were all
    # done before the fifth kill's restarted trainer stepped once, on a quiet machine after the
    # mesh got faster); the job ends soon after it is resumed anyway
    job = Job(tmp_path / "run", tiny_model, arith_data, "services.rollout.replicas=2", "trainer.total_steps=60",
              "weights.transfer_timeout_s=10", "services.restart.max_restarts=6",
              "services.restart.backoff_max_s=2", "services.restart.heartbeat_timeout_s=30").start()
    try:
        job.wait_step(1)
        # the reward worker frozen (SIGSTOP, never continued): alive but silent counts as
        # crashed, so the supervisor kills it after the heartbeat timeout and starts it again
        old = job.kill("reward-0", signal.SIGSTOP)
        job.wait_back("reward-0", old)
        job.wait_step(2)
        # the trainer, at three moments; no step is waited for between the last two
        for kill, then_a_step in ((lambda: job.kill_tree("trainer"), True),  # as a step ends
                                  (lambda: _kill_trainer_when(job, "setting pause state to PAUSED_ALL"), False),
                                  (lambda: job.kill_tree("trainer"), True)):  # just back: replicas catching up
            old = kill()
            job.wait_back("trainer", old)
            if then_a_step:
                job.wait_trained_since_restart()
        old = job.kill_tree("trainer")
        job.kill_tree("rollout-1")  # a replica lost while the trainer restarts (it comes back in the background)
        job.wait_back("trainer", old)
        version = job.wait_trained_since_restart()
        # the replica never killed follows this restarted trainer too: within a publish or
        # two, not after a version-lag kill
        job.wait_served("rollout-0", version, timeout=120)
        first_run = job.output()
        trainer_log, replica_log = job.log("trainer"), job.log("rollout-0")
        job.kill_tree("trainer")
        job.wait_for(lambda s: s["services"]["trainer"]["restarting"] or not s["services"]["trainer"]["alive"],
                     "the trainer restarting")
        job.kill_all()  # the machine is lost while the trainer restarts
        job.start()  # the same command resumes it
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    status = job.status()
    assert status["state"] == "succeeded", status
    out = job.output()
    assert "reward-0 is stuck (no heartbeat for" in first_run, first_run[-4000:]
    assert "reward-0 exited with code -9 (no heartbeat for" in first_run and "reward-0 ready again" in first_run
    assert first_run.count("trainer exited with code -9") == 4, first_run[-4000:]
    # rollout-0 is never killed: it is never restarted either, not even for lagging a
    # restarted trainer's weights (the version-lag rule), and no publish fails to form its group
    assert "rollout-0 is stuck (serves policy version" not in out, out[-4000:]
    assert "rollout-0 exited with code -9; restart" not in first_run, first_run[-4000:]
    assert "forming the gloo group" not in job.log("trainer")
    assert "Broken pipe" not in job.log("rollout-0")
    # rollout-0 loaded each restarted trainer's first trained version (from the channel, or
    # a later one from its snapshot when it published before rollout-0 had subscribed again)
    served = served_versions(replica_log)
    restarts = first_versions_after_restarts(trainer_log)
    assert len(restarts) >= 3, trainer_log[-3000:]
    for resumed_at, version in restarts:
        assert any(t >= resumed_at and v >= version for t, v in served), (resumed_at, version, served)
    assert "resuming: " in out and "still in flight (from the queue's ledger)" in job.log("feeder")
    trace = admission_trace(job.run_dir, n=4)
    assert trace and max(trace) <= LIMIT, trace
    ledger = assert_ledger_exact(job.run_dir)
    # drops are counted exactly once whatever died when (the trainer's checkpointed counters)
    stages = ledger["audit"]["stages"]
    assert stages.get("dropped", 0) == ledger["dropped_stale"] + ledger["dropped_error"], ledger
    print(f"admission: {len(trace)} puts, at most {max(trace)} prompts in flight (limit {LIMIT})")


def test_one_replica_killed_then_frozen_then_the_job_is_stopped_and_resumed(tmp_path, tiny_model, arith_data):
    """One replica: SIGKILL it (the mesh waits for its restart), SIGSTOP it across a weight
    publication and SIGCONT it, then SIGTERM the job and resume it with the same command."""
    # 30 steps: on a quiet machine the first 4 steps take half a second and a replica's restart
    # about 20 s, so 6 steps were all done before the SIGTERM below
    job = Job(tmp_path / "run", tiny_model, arith_data, "trainer.total_steps=30").start()
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
