"""Probes and the gateway's own metrics: ``/health`` (the process answers), ``/ready`` (the
job store answers) and ``/metrics`` (token-guarded: jobs by state, plus the job-level series
of every job it runs, gateway_svc/job_metrics.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from gateway_svc.job_metrics import job_metrics_text
from gateway_svc.models import ErrorBody, JobStateName
from gateway_svc.routes.deps import AUTH, ERRORS, Manager

router = APIRouter(tags=["probes"])


class GatewayMetrics:
    """The gateway's own series, in a registry of each app's own (apps in one process never clash)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.jobs = Gauge("meshrl_gateway_jobs", "Jobs known to the gateway, by state", ["state"],
                          registry=self.registry)


@router.get("/health", summary="process is alive")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", summary="the job store answers", responses={503: {"model": ErrorBody}})
def ready(manager: Manager) -> dict[str, Any]:
    try:
        version = manager.store.version()
    except Exception as exc:  # the database being down is the one 5xx: not ready
        raise HTTPException(503, f"job store not reachable: {exc}") from None
    return {"status": "ready", "schema_version": version}


@router.get("/metrics", dependencies=AUTH, responses=ERRORS, response_class=Response)
def metrics(request: Request, manager: Manager) -> Response:
    own: GatewayMetrics = request.app.state.metrics
    counts = {s: 0 for s in JobStateName.__args__}  # type: ignore[attr-defined]
    rows = manager.store.list(limit=10_000)
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    for state, n in counts.items():
        own.jobs.labels(state=state).set(n)
    return Response(generate_latest(own.registry) + job_metrics_text(rows), media_type=CONTENT_TYPE_LATEST)
