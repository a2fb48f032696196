"""The gateway's per-job series (gateway_svc/job_metrics.py) and secret redaction
(gateway_svc/redact.py) on plain values."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway_svc.job_metrics import RECENT_S, job_metrics_text
from gateway_svc.redact import redact_overrides, redact_spec, redact_text, restore
from gateway_svc.store import JobRow


def _series(text: bytes) -> dict[tuple[str, frozenset], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


def _row(job_id: str, state: str, updated_at: float, **progress) -> JobRow:
    return JobRow(id=job_id, name="j", state=state, spec_yaml="", handle={"pid": 1}, updated_at=updated_at,
                  progress=progress, detail="stalled: no progress for 300s" if progress.pop("stalled_detail", False) else "")


def test_live_and_recently_finished_jobs_are_exported_old_ones_not():
    now = 1_000_000.0
    rows = [
        _row("live-1", "running", now - 5000, ledger={"fed": 8, "trained": 4}, restarts={"rollout-0": 2},
             ledger_stages={"trained": 4, "scored": 2}, stalled=False),
        _row("stuck-2", "running", now, stalled_detail=True),  # a controller that says so only in its detail
        _row("done-3", "succeeded", now - RECENT_S / 2, ledger={"trained": 16}, stalled=True),
        _row("old-4", "succeeded", now - RECENT_S - 1, ledger={"trained": 16}),
        JobRow(id="queued-5", name="j", state="pending", spec_yaml=""),  # not launched: nothing to say yet
    ]
    s = _series(job_metrics_text(rows, now))
    assert s[("meshrl_job_ledger_samples_total", frozenset({"job_id": "live-1", "stage": "trained"}.items()))] == 4
    assert s[("meshrl_job_service_restarts_total", frozenset({"job_id": "live-1", "service": "rollout-0"}.items()))] == 2
    assert s[("meshrl_ledger_samples", frozenset({"job_id": "live-1", "stage": "scored"}.items()))] == 2
    assert s[("meshrl_job_stalled", frozenset({"job_id": "live-1"}.items()))] == 0
    assert s[("meshrl_job_stalled", frozenset({"job_id": "stuck-2"}.items()))] == 1
    assert s[("meshrl_job_stalled", frozenset({"job_id": "done-3"}.items()))] == 0  # a finished job is not stalled
    ids = {dict(ls).get("job_id") for _, ls in s}
    assert ids == {"live-1", "stuck-2", "done-3"}


def test_bad_progress_values_are_left_out():
    rows = [_row("x-1", "running", 0.0, ledger={"fed": -1, "ok": 3, "b": True, "s": "7"}, restarts="many")]
    s = _series(job_metrics_text(rows, 1.0))
    assert [dict(ls)["stage"] for n, ls in s if n == "meshrl_job_ledger_samples_total"] == ["ok"]
    assert not [n for n, _ in s if n == "meshrl_job_service_restarts_total"]


def test_secrets_are_redacted_and_restored():
    spec = {"queues": {"type": "redis", "url": "rediss://app:p%40ss@redis:6380/0", "password": "hunter2",
                       "password_env": "REDIS_PW"},
            "data": {"train_files": ["/data/t.parquet"]}, "tracking": [{"uri": "http://u:tok@mlflow:5000"}]}
    shown, found = redact_spec(spec)
    assert shown["queues"] == {"type": "redis", "url": "rediss://app:***@redis:6380/0", "password": "***",
                               "password_env": "REDIS_PW"}
    assert shown["tracking"][0]["uri"] == "http://u:***@mlflow:5000" and shown["data"] == spec["data"]
    assert restore(shown, found) == spec
    assert redact_text("redis://redis:6379/0") == "redis://redis:6379/0"  # nothing to hide
    assert redact_overrides(["queues.password=x y", "queues.url=redis://:pw@h:1/0", "rollout.n=4"]) == [
        "queues.password=***", "queues.url=redis://:***@h:1/0", "rollout.n=4"]
