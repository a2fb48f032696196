"""What a job produces, read through the gateway: its metric series (for curves), its
lifecycle events, and its services' logs (the last lines, optionally followed)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from gateway_svc.jobs import JobNotFound
from gateway_svc.logs import MAX_TAIL_LINES, UnknownLog
from gateway_svc.models import JobEvents, JobMetrics
from gateway_svc.routes.deps import AUTH, ERRORS, JobId, Manager, found

router = APIRouter(tags=["jobs"], dependencies=AUTH)


@router.get("/v1/jobs/{job_id}/metrics", response_model=JobMetrics, responses=ERRORS,
            summary="the job's metric series (for curves)")  # fmt: skip
def job_metrics(
    job_id: JobId,
    manager: Manager,
    since: Annotated[float, Query(ge=0, le=1e12, allow_inf_nan=False, description="only points after this ts")] = 0.0,
) -> dict[str, Any]:
    return found(manager.metrics, job_id, since=since)


@router.get("/v1/jobs/{job_id}/events", response_model=JobEvents, responses=ERRORS,
            summary="the job's lifecycle events, oldest first")  # fmt: skip
def job_events(
    job_id: JobId,
    manager: Manager,
    since: Annotated[float, Query(ge=0, le=1e12, allow_inf_nan=False, description="only events after this ts")] = 0.0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    return found(manager.events, job_id, since=since, limit=limit)


@router.get(
    "/v1/jobs/{job_id}/logs", response_class=StreamingResponse,
    summary="a service's log: the last lines, optionally followed",
    responses={**ERRORS, 200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                               "description": "log text; header `X-Log-Services` lists the job's logs"}},
)  # fmt: skip
def job_logs(
    job_id: JobId,
    manager: Manager,
    service: Annotated[str, Query(min_length=1, max_length=64, description="`job` (the driver), `trainer`, "
                                  "`reward-0`, `rollout-0`, ...; the 404 lists the job's logs")] = "job",
    tail: Annotated[int, Query(ge=0, le=MAX_TAIL_LINES, description="last lines to send first")] = 200,
    follow: Annotated[bool, Query(description="then send new lines as they are written")] = False,
    max_seconds: Annotated[float, Query(ge=0, le=3600, allow_inf_nan=False,
                                        description="with follow: stop after this long (the stream also ends "
                                                    "when the job finishes)")] = 30.0,
) -> StreamingResponse:
    try:
        names = manager.log_services(job_id)
        chunks = manager.logs(job_id, service, tail=tail, follow=follow, max_seconds=max_seconds)
    except (UnknownLog, JobNotFound) as exc:
        raise HTTPException(404, str(exc)) from None

    async def body() -> Any:
        # Each read runs in a worker thread and returns within the follow poll (empty
        # chunks are ticks), so a client that hangs up frees its thread at once.
        while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
            if chunk:
                yield chunk

    return StreamingResponse(body(), media_type="text/plain; charset=utf-8",
                             headers={"X-Log-Services": ",".join(names), "Cache-Control": "no-store"})  # fmt: skip
