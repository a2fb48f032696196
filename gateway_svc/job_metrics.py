"""Job-level Prometheus series on the gateway's ``/metrics``, one set per job it runs.

The gateway is the one fixed, scraped target that knows every job (``deploy/prometheus``
scrapes ``gateway:8600`` with its token). It already reads each job's progress from its
launcher: ``status.json`` of a ``meshrl run`` controller (local and Ray launchers), or the
deployment launcher's own reading of the workers' reports and the Redis ledger (compose,
Kubernetes; :mod:`gateway_svc.launchers.deployment`). From that progress it exports,
labelled ``job_id``:

    meshrl_job_ledger_samples_total{job_id,stage}     the job ledger over restarts (fed, generated, ...)
    meshrl_job_service_restarts_total{job_id,service} restarts per service
    meshrl_job_stalled{job_id}                        1 while the job makes no progress
    meshrl_ledger_samples{job_id,stage}               the queue's per-sample ledger by latest stage

for every running or paused job, and for a finished one during ``recent_s`` after its last
update (so its final counts are scraped too). These are the series the ``MeshrlJobStalled``
and ``MeshrlServiceRestarting`` alerts and the ledger panels of the Grafana dashboard read.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway_svc.store import JobRow

#: How long a finished job's series stay on /metrics after its last update.
RECENT_S = 600.0
_LIVE = ("pending", "running", "paused")


def _counts(progress: dict[str, Any], key: str) -> dict[str, int]:
    got = progress.get(key)
    if not isinstance(got, dict):
        return {}
    return {str(k): v for k, v in got.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def job_families(rows: Iterable[JobRow], now: float | None = None, recent_s: float = RECENT_S) -> list[Metric]:
    """The metric families above for ``rows`` (jobs the gateway knows)."""
    now = time.time() if now is None else now
    ledger = CounterMetricFamily("meshrl_job_ledger_samples", "Samples per job ledger stage, over restarts "
                                 "(docs/supervision.md)", labels=["job_id", "stage"])
    restarts = CounterMetricFamily("meshrl_job_service_restarts", "Restarts per service of the job",
                                   labels=["job_id", "service"])
    stalled = GaugeMetricFamily("meshrl_job_stalled", "1 while the job makes no progress past "
                                "services.restart.stall_warn_s", labels=["job_id"])
    stages = GaugeMetricFamily("meshrl_ledger_samples", "Samples whose latest stage in the queue's ledger is "
                               "`stage`", labels=["job_id", "stage"])
    for row in rows:
        live = row.state in _LIVE
        if not row.handle or not (live or now - row.updated_at <= recent_s):
            continue
        p = row.progress if isinstance(row.progress, dict) else {}
        for stage, n in sorted(_counts(p, "ledger").items()):
            ledger.add_metric([row.id, stage], float(n))
        for service, n in sorted(_counts(p, "restarts").items()):
            restarts.add_metric([row.id, service], float(n))
        for stage, n in sorted(_counts(p, "ledger_stages").items()):
            stages.add_metric([row.id, stage], float(n))
        is_stalled = p.get("stalled") if isinstance(p.get("stalled"), bool) else row.detail.startswith("stalled")
        stalled.add_metric([row.id], 1.0 if live and is_stalled else 0.0)
    return [ledger, restarts, stalled, stages]


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def job_metrics_text(rows: Iterable[JobRow], now: float | None = None) -> bytes:
    """The Prometheus text of :func:`job_families` (appended to the gateway's own registry)."""
    registry = CollectorRegistry()
    registry.register(_Families(job_families(rows, now)))
    return generate_latest(registry)


__all__ = ["RECENT_S", "job_families", "job_metrics_text"]
