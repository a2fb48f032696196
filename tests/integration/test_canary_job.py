"""The canary gate in a real ``meshrl run`` job: two vLLM replicas, one of them the canary.

Healthy versions are promoted (every replica loads them); then a version whose tensors are
valid but wrong (the publisher's test-only fault negates ``model.norm.weight`` of the 2nd
candidate: every logit flips sign, nothing is NaN, every shape is right) is rejected at the
canary. It never reaches the other replica, the canary goes back to the promoted version,
the job pauses (``weights.rollout.on_reject=pause``), and after ``meshrl canary --resume``
it trains on and promotes a good version again. The ledger stays exact.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.fixtures.jobs import make_arith_parquet
from tests.integration.job_faults_support import REPO, Job, assert_ledger_exact

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(2400)]

# 16 steps: the second candidate (the bad one) must be judged before the job could end, and a
# good one promoted after the resume; at 8 the faster mesh sometimes finished first (the gate's
# budget lets the trainer run 6 versions past the promoted one)
CANARY = ("services.rollout.replicas=2", "weights.rollout.mode=canary", "weights.rollout.on_reject=pause",
          "async.max_staleness=3", "trainer.total_steps=16", "trainer.save_freq=2")


def events(st: dict) -> list[tuple[int, str]]:
    return [(e["version"], e["kind"]) for e in (st.get("weights") or {}).get("events", [])]


def meshrl_canary(run_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshrl_cli", "canary", str(run_dir), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def trained_steps(trainer_log: str) -> int:
    """Steps the trainer's log reports as done ("step N version V ...")."""
    return len(re.findall(r"\bstep \d+ version \d+ ", trainer_log))


def loaded_versions(log: str) -> set[int]:
    """Every version a replica's log says it served."""
    return {int(v) for v in re.findall(r"now serves policy version (\d+)|serves v(\d+) \(", log) for v in v if v}


def test_a_wrong_version_is_rejected_at_the_canary_and_the_job_resumes_on_a_good_one(tmp_path, tiny_model,
                                                                                     monkeypatch):
    data = make_arith_parquet(tmp_path / "arith", train_size=96)
    monkeypatch.setenv("MESHRL_TEST_WEIGHTS_FAULT", "candidate=2:negate:model.norm.weight")
    job = Job(tmp_path / "run", tiny_model, data, *CANARY).start()
    try:
        st = job.wait_for(lambda s: "rejected" in {k for _, k in events(s)}, "a rejection", timeout=1500)
        st = job.wait_for(lambda s: s.get("detail", "").startswith("paused"), "the pause")
        kinds = events(st)
        rejected = next(v for v, k in kinds if k == "rejected")
        promoted = [v for v, k in kinds if k == "promoted"]
        assert promoted[0] == 0 and len(promoted) >= 2 and promoted[-1] < rejected, kinds
        w = st["weights"]
        assert w["mode"] == "canary" and str(rejected) in w["rejected"] and "logprob_gap" in w["rejected"][str(rejected)]
        # every candidate was judged with its own weights (the trainer had stepped past them)
        judged = [e for e in w["events"] if e["kind"] in ("promoted", "rejected") and e["version"] > 0]
        assert judged and all(e["measurements"].get("judged_lag") == 0 for e in judged), judged
        roles = {name: r["role"] for name, r in w["replicas"].items()}
        assert sorted(roles.values()) == ["canary", "promoted"], w
        canary = next(n for n, role in roles.items() if role == "canary")
        other = next(n for n, role in roles.items() if role == "promoted")
        # the canary goes back to the promoted version; the other never served the rejected one
        job.wait_for(lambda s: s["weights"]["replicas"][canary]["served_version"] == promoted[-1], "the rollback")
        assert rejected not in loaded_versions((job.run_dir / "logs" / f"{other}.log").read_text())
        assert rejected in loaded_versions((job.run_dir / "logs" / f"{canary}.log").read_text())
        # paused: no step is trained (counted in the trainer's log: status.json can show the pause
        # before the step that judged the candidate has committed)
        job.wait_for(lambda s: "training paused until resumed" in job.log("trainer"), "the paused trainer")
        steps = trained_steps(job.log("trainer"))
        time.sleep(5)
        assert trained_steps(job.log("trainer")) == steps and job.status()["state"] == "running"
        shown = json.loads(meshrl_canary(job.run_dir, "--json").stdout)
        assert shown["paused"].startswith(f"v{rejected} rejected") and shown["promoted"] == promoted[-1]
        r = meshrl_canary(job.run_dir, "--resume")
        assert r.returncode == 0 and "resumed" in r.stdout, r.stdout + r.stderr
        assert job.finish() == 0, job.output()[-4000:]
    finally:
        job.stop()
    st = job.status()
    assert st["state"] == "succeeded", st
    trainer_log = (job.run_dir / "logs" / "trainer.log").read_text()
    # it resumed and promoted a good version. The publisher's log is the record: status.json's
    # scrapes of the trainer and of the replicas are taken at different moments, and the last
    # promotion can come less than a scrape before the job ends (seen: v6 promoted at step 7
    # of 8, 0.1 s before the end, while the final status.json still showed it as the candidate)
    assert (rejected, "rejected") in events(st), events(st)
    promoted_logged = {0} | {int(v) for v in re.findall(r"weights v(\d+) promoted", trainer_log)}
    assert max(promoted_logged) > rejected, promoted_logged
    # the other replica served promoted versions only, every one of them
    other_served = loaded_versions((job.run_dir / "logs" / f"{other}.log").read_text())
    assert other_served and other_served <= promoted_logged, (other_served, promoted_logged)
    for name in (canary, other):
        served = loaded_versions((job.run_dir / "logs" / f"{name}.log").read_text())
        assert (rejected in served) == (name == canary), (name, served)
    ledger = assert_ledger_exact(job.run_dir)
    assert f"canary: v{rejected} rejected" in trainer_log and "training paused until resumed" in trainer_log
    assert ledger["dropped_stale"] > 0  # the rejected version's samples, dropped for their version
