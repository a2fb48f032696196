"""The restart policy every launcher applies (services/supervision.py)."""

from __future__ import annotations

import pytest

from services.config.job import parse_job
from services.ledger import Meter
from services.supervision import RestartConfig, Supervisor, stall_reason


def test_crashes_are_restarted_with_doubling_backoff_until_the_budget_is_spent():
    sup = Supervisor(RestartConfig(max_restarts=3, backoff_s=1.0, backoff_max_s=3.0), ["rollout-0", "reward-0"])
    delays = [sup.exited("rollout-0", "exited with code -9", t) for t in range(3)]
    assert [d.action for d in delays] == ["restart"] * 3
    assert [d.delay_s for d in delays] == [1.0, 2.0, 3.0]
    final = sup.exited("rollout-0", "exited with code 1", 10)
    assert final.action == "fail"
    assert "rollout-0 exited with code 1" in final.reason and "max_restarts=3" in final.reason
    # the budget is per service
    assert sup.exited("reward-0", "exited with code -9", 11).action == "restart"
    assert sup.restarts() == {"rollout-0": 3, "reward-0": 1}


def test_a_silent_service_is_reported_stuck_after_the_heartbeat_deadline():
    sup = Supervisor(RestartConfig(heartbeat_timeout_s=10), [])
    sup.started("trainer", 0.0)
    sup.beat("trainer", 5.0)
    assert sup.stuck(14.0) == []
    [(name, why)] = sup.stuck(16.0)
    assert name == "trainer" and "no heartbeat for 11s" in why
    sup.exited("trainer", "exited with code -9", 16.0)
    assert sup.stuck(100.0) == []  # not running: a restart is under way


def test_no_progress_warns_then_fails_with_the_reason():
    sup = Supervisor(RestartConfig(stall_warn_s=10, stall_timeout_s=30), [])
    sup.progress({"trained": 0, "scored": 0}, 0.0)
    sup.progress({"trained": 0, "scored": 4}, 5.0)
    assert sup.stall(14.0, "x") is None
    warn = sup.stall(16.0, "the reward workers are not scoring")
    assert not warn.fatal and "no progress for 11s: the reward workers are not scoring" in warn.reason
    # a counter going down (a trainer restored from its checkpoint) is not progress
    sup.progress({"trained": 0, "scored": 2}, 20.0)
    assert sup.stall(36.0, "why").fatal


def test_stall_reason_names_where_the_job_waits():
    assert "trainer is not consuming" in stall_reason({"experience": 3}, in_flight=8, max_in_flight=8)
    assert "reward workers" in stall_reason({"rollouts": 2}, in_flight=8, max_in_flight=8)
    assert "rollout replicas" in stall_reason({"prompts": 1}, in_flight=8, max_in_flight=8)
    assert "in flight" in stall_reason({}, in_flight=8, max_in_flight=8)
    assert "rollout-0 to restart" in stall_reason({"prompts": 1}, in_flight=8, max_in_flight=8, restarting=["rollout-0"])


def test_meter_keeps_the_counts_of_earlier_incarnations():
    m = Meter({"generated": 10})
    m.update("rollout-0", {"generated": 5})
    m.update("rollout-1", {"generated": 3})
    m.update("rollout-0", {"generated": 2})  # restarted: its counter began again
    assert m.total("generated") == 10 + 5 + 3 + 2


def test_the_ledger_keeps_a_restarted_services_counts_apart_from_its_predecessors(tmp_path):
    from services.ledger import Ledger

    ledger = Ledger(tmp_path, n=4)
    ledger.observe("reward-0", {"meshrl_reward_samples_total": 16.0})
    # frozen, killed, restarted: the new process scored 20 before its first scrape (more
    # than the last count seen of the old one, so no counter went down)
    ledger.observe("reward-0", {"meshrl_reward_samples_total": 20.0}, incarnation=1)
    ledger.observe("rollout-0", {"meshrl_rollout_samples_total": 8.0})
    assert ledger.counts()["scored"] == 36 and ledger.counts()["generated"] == 8


def test_restart_policy_is_part_of_the_job_spec_and_strict():
    base = {"name": "t", "model": {"path": "/m"}, "data": {"train_files": "/d.parquet", "train_batch_size": 4},
            "rollout": {"n": 4}, "actor": {"ppo_mini_batch_size": 4}}
    spec = parse_job(base, ["services.restart.max_restarts=5", "services.restart.stall_timeout_s=60"])
    assert spec.services.restart.max_restarts == 5 and spec.services.restart.stall_timeout_s == 60
    with pytest.raises(ValueError, match="services.restart.max_restart"):
        parse_job(base, ["services.restart.max_restart=5"])


def test_a_replica_serving_too_old_a_version_for_too_long_is_stuck():
    sup = Supervisor(RestartConfig(heartbeat_timeout_s=10), [])
    for name in ("rollout-0", "rollout-1"):
        sup.started(name, 0.0)
    sup.versions(5, {"rollout-0": 4, "rollout-1": 2}, allowed=1, now=1.0)
    for t in (5.0, 12.0):
        sup.beat("rollout-0", t)
        sup.beat("rollout-1", t)
    assert sup.stuck(10.0) == []
    [(name, why)] = sup.stuck(12.0)
    assert name == "rollout-1" and "serves policy version 2 while the trainer is at 5" in why
    sup.versions(6, {"rollout-0": 6, "rollout-1": 6}, allowed=1, now=12.5)  # caught up
    assert sup.stuck(12.5) == []
    sup.versions(None, {"rollout-1": 2}, allowed=1, now=13.0)  # trainer unknown (restarting): no verdict
    assert sup.stuck(30.0) == [] or all("no heartbeat" in w for _, w in sup.stuck(30.0))


def test_a_worker_reads_the_jobs_restart_policy_and_probes_wildcard_binds_on_the_loopback(tmp_path):
    from worker_svc.worker import job_restart_policy, local_address

    (tmp_path / "spec.yaml").write_text("services:\n  restart:\n    max_restarts: 7\n    heartbeat_timeout_s: 9\n")
    policy = job_restart_policy(tmp_path)
    assert (policy.max_restarts, policy.heartbeat_timeout_s, policy.backoff_s) == (7, 9.0, 1.0)
    assert job_restart_policy(tmp_path / "nowhere") == RestartConfig()
    assert local_address("0.0.0.0:9101") == "127.0.0.1:9101"
    assert local_address("[::]:9101") == "[::1]:9101"
    assert local_address("10.0.0.5:9101") == "10.0.0.5:9101"


def test_scanning_a_log_for_readiness_never_takes_half_a_line(tmp_path):
    from services.readiness import ready_line, scan_log_for_ready

    log = tmp_path / "svc.log"
    assert scan_log_for_ready(log, 0) == (None, 0)  # not written yet
    line = ready_line("reward", "reward-0", {"metrics": "0.0.0.0:9102"})
    log.write_text("loading\n" + line[:20])
    ready, offset = scan_log_for_ready(log, 0)
    assert ready is None and offset == len("loading\n")
    log.write_text("loading\n" + line + "\nserving\n")
    ready, offset = scan_log_for_ready(log, offset)
    assert ready is not None and ready.address("metrics") == "0.0.0.0:9102"
    assert scan_log_for_ready(log, offset) == (None, offset)  # an older start's line is not seen again
