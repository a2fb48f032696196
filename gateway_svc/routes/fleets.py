"""``/v1/fleets``: start a fleet of warm rollout replicas (JSON, or the YAML file itself), list
fleets, get one, change a running one's replica bounds (``PATCH``), read its scaling decisions
(``/events``), stop one (gateway_svc/fleets.py, docs/fleet.md). Bad input is a 4xx whose
``detail`` names each bad field, as for jobs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from gateway_svc.fleets import FleetConflict, FleetLaunchError, FleetManager, FleetNotFound, FleetStillStopping
from gateway_svc.models import ErrorBody, Fleet, FleetEvents, FleetList, FleetScale, FleetSubmit
from gateway_svc.routes.deps import AUTH, read_spec_body
from gateway_svc.spec_validation import SpecRejected
from services.config.fleet import NAME_PATTERN

router = APIRouter(tags=["fleets"], dependencies=AUTH)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong bearer token"},
    404: {"model": ErrorBody, "description": "no such fleet"},
    409: {"model": ErrorBody, "description": "the fleet's state does not allow this"},
}
FleetName = Annotated[str, Path(pattern=f"^{NAME_PATTERN}$", description="the fleet's name (its spec's `name`)")]


def fleet_manager(request: Request) -> FleetManager:
    """The app's fleet manager; a 404 on an app built without one (it runs no fleets)."""
    fleets = getattr(request.app.state, "fleets", None)
    if fleets is None:
        raise HTTPException(404, "this gateway runs no fleets")
    return fleets


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SpecRejected as exc:
        raise HTTPException(400, str(exc)) from None
    except FleetNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except FleetConflict as exc:
        raise HTTPException(409, str(exc)) from None
    except FleetLaunchError as exc:
        raise HTTPException(500, str(exc)) from None


@router.post(
    "/v1/fleets",
    status_code=201,
    response_model=Fleet,
    summary="start a fleet",
    responses={**ERRORS, 400: {"model": ErrorBody, "description": "bad spec: names each bad field"},
               409: {"model": ErrorBody, "description": "a fleet of that name is running"},
               413: {"model": ErrorBody}, 415: {"model": ErrorBody}},  # fmt: skip
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": FleetSubmit.model_json_schema()},
                "application/yaml": {"schema": {"type": "string", "description": "the YAML fleet spec file"}},
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
async def start_fleet(request: Request) -> dict[str, Any]:
    fleets = fleet_manager(request)
    spec, overrides = await read_spec_body(request, FleetSubmit)
    return await run_in_threadpool(_call, fleets.start, spec, overrides)


@router.get("/v1/fleets", response_model=FleetList, responses=ERRORS, summary="list fleets by name")
def list_fleets(request: Request) -> dict[str, Any]:
    return {"fleets": fleet_manager(request).list()}


@router.get("/v1/fleets/{name}", response_model=Fleet, responses=ERRORS,
            summary="one fleet: replicas, attached jobs with each replica's report, its spec")  # fmt: skip
def get_fleet(name: FleetName, request: Request) -> dict[str, Any]:
    return _call(fleet_manager(request).get, name, with_spec=True)


@router.patch(
    "/v1/fleets/{name}", response_model=Fleet,
    responses={**ERRORS, 400: {"model": ErrorBody, "description": "bounds outside 1 <= min <= max <= the spec's "
                                                                  "scaling.max_replicas: names each"},
               409: {"model": ErrorBody, "description": "the fleet is not running"},
               422: {"model": ErrorBody, "description": "not a FleetScale body"}},
    summary="set a running fleet's replica bounds (it adds or drains replicas to stay within them)",
)  # fmt: skip
def scale_fleet(name: FleetName, body: FleetScale, request: Request) -> dict[str, Any]:
    fleets = fleet_manager(request)
    if body.replicas is not None and (body.min_replicas is not None or body.max_replicas is not None):
        raise HTTPException(400, "replicas: give either replicas (min = max) or min_replicas / max_replicas")
    lo, hi = (body.replicas, body.replicas) if body.replicas is not None else (body.min_replicas, body.max_replicas)
    if lo is None and hi is None:
        raise HTTPException(400, "body: give min_replicas, max_replicas or replicas")
    return _call(fleets.scale, name, lo, hi)


@router.get("/v1/fleets/{name}/events", response_model=FleetEvents, responses=ERRORS,
            summary="the fleet's scaling decisions (replicas added or drained, and why), oldest first")  # fmt: skip
def fleet_events(
    name: FleetName,
    request: Request,
    since: Annotated[float, Query(ge=0, le=1e12, allow_inf_nan=False, description="only events after this ts")] = 0.0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> dict[str, Any]:
    return _call(fleet_manager(request).events, name, since=since, limit=limit)


@router.delete(
    "/v1/fleets/{name}", response_model=Fleet,
    responses={**ERRORS, 202: {"model": Fleet, "description": "asked to stop; still stopping at the deadline"},
               409: {"model": ErrorBody, "description": "the fleet is not running"}},
    summary="stop a fleet (its replicas detach their jobs first) and wait for it",
)  # fmt: skip
def stop_fleet(
    name: FleetName,
    request: Request,
    timeout: Annotated[float, Query(ge=0, le=600, allow_inf_nan=False,
                                    description="seconds to wait for it to stop (then 202, still stopping)")] = 60.0,
) -> Any:
    try:
        return _call(fleet_manager(request).stop, name, timeout=timeout)
    except FleetStillStopping as exc:
        return JSONResponse(Fleet.model_validate(exc.view).model_dump(), status_code=202)
