"""``/v1/jobs``: submit a job (JSON, or the YAML file itself), list jobs, get one, and cancel,
pause or resume it. Bad input is a 4xx whose ``detail`` says what is wrong; a bad spec names
each field."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from gateway_svc.jobs import job_to_dict
from gateway_svc.models import ErrorBody, Job, JobList, JobStateName, JobSubmit
from gateway_svc.routes.deps import AUTH, ERRORS, JobId, Manager, found, read_spec_body
from gateway_svc.spec_validation import SpecRejected

router = APIRouter(tags=["jobs"], dependencies=AUTH)


@router.post(
    "/v1/jobs",
    status_code=201,
    response_model=Job,
    summary="submit a job",
    responses={**ERRORS, 400: {"model": ErrorBody, "description": "bad spec: names each bad field"},
               413: {"model": ErrorBody}, 415: {"model": ErrorBody}},  # fmt: skip
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": JobSubmit.model_json_schema()},
                "application/yaml": {"schema": {"type": "string", "description": "the YAML job spec file"}},
            },
        },
        "parameters": [
            {
                "name": "override", "in": "query", "required": False,
                "schema": {"type": "array", "items": {"type": "string"}},
                "description": "with a YAML body: `a.b=c` overrides (repeat the parameter)",
            }
        ],
    },  # fmt: skip
)
async def submit(request: Request, manager: Manager) -> dict[str, Any]:
    spec, overrides = await read_spec_body(request, JobSubmit)
    try:
        row = await run_in_threadpool(manager.submit, spec, overrides)
    except SpecRejected as exc:
        raise HTTPException(400, str(exc)) from None
    return job_to_dict(row)


@router.get("/v1/jobs", response_model=JobList, responses=ERRORS, summary="list jobs, newest first")
def list_jobs(
    manager: Manager,
    state: Annotated[JobStateName | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> dict[str, Any]:
    return {"jobs": [job_to_dict(r) for r in manager.list(state=state, limit=limit, offset=offset)]}


@router.get("/v1/jobs/{job_id}", response_model=Job, responses=ERRORS, summary="one job, with its resolved spec")
def get_job(job_id: JobId, manager: Manager) -> dict[str, Any]:
    return job_to_dict(found(manager.get, job_id), with_spec=True)


def _action_route(verb: str, doc: str) -> None:
    """``POST /v1/jobs/{job_id}:<verb>``: the manager's method of that name on the job."""

    @router.post(f"/v1/jobs/{{job_id}}:{verb}", response_model=Job, responses=ERRORS, summary=doc,
                 name=f"{verb}_job")  # fmt: skip
    def _action(job_id: JobId, manager: Manager) -> dict[str, Any]:
        return job_to_dict(found(getattr(manager, verb), job_id))


_action_route("cancel", "cancel a job (terminate, then kill after a timeout)")
_action_route("pause", "pause a running job")
_action_route("resume", "resume a paused job")
