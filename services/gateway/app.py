"""The gateway's REST API (FastAPI).

    app = create_app(manager, token="s3cret")      # uvicorn.run(app, ...)

Every route under ``/v1`` and ``/metrics`` needs ``Authorization: Bearer <token>`` (compared
in constant time); ``/health``, ``/ready``, ``/openapi.json`` and the dashboard page (static,
it carries no data: its script calls the API with the token you give it) are open.
Bad input is a 4xx whose ``detail`` says what is wrong; a bad spec names each field.
Swagger UI (``/docs``) and ReDoc (``/redoc``) load their scripts and styles from the gateway
itself (``/static/...``, the files the ``fastapi-offline`` package ships): no CDN, so they
work air-gapped. Every request is written to the access log (logger ``meshrl.gateway.access``,
and ``access_log`` if given): client, method, path (no query string), status, milliseconds.
"""


import hmac
import logging
import time
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from pydantic import ValidationError

from services.gateway.dashboard import DASHBOARD_HTML
from services.gateway.job_metrics import job_metrics_text
from services.gateway.jobs import JobConflict, JobManager, JobNotFound, job_to_dict
from services.gateway.logs import MAX_TAIL_LINES, UnknownLog
from services.gateway.models import ErrorBody, Job, JobEvents, JobList, JobMetrics, JobStateName, JobSubmit
from services.gateway.spec_validation import MAX_SPEC_BYTES, SpecRejected

_YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
access_log = logging.getLogger("meshrl.gateway.access")


def static_dir() -> FilePath:
    """The Swagger UI / ReDoc files shipped by the ``fastapi-offline`` package."""
    import fastapi_offline

    return FilePath(fastapi_offline.__file__).parent / "static"

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong bearer token"},
    404: {"model": ErrorBody, "description": "no such job"},
    409: {"model": ErrorBody, "description": "the job's state does not allow this"},
}
JobId = Annotated[str, Path(min_length=1, max_length=128, description="job id from `POST /v1/jobs`")]


class AccessLogFile:
    """Appends timestamped lines to a file (line-buffered, thread-safe) and to the
    ``meshrl.gateway.access`` logger; shared by the REST and gRPC front ends."""

    def __init__(self, path: FilePath | None) -> None:
        import threading

        self._lock = threading.Lock()
        self._f = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (lives as long as the gateway)

    def __call__(self, line: str) -> None:
        access_log.info(line)
        if self._f is not None:
            with self._lock:
                self._f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {line}\n")

    def close(self) -> None:
        if self._f is not None:
            with self._lock:
                self._f.close()
                self._f = None


def create_app(manager: JobManager, token: str, *, title: str = "meshrl gateway",
               access_log_file: "FilePath | AccessLogFile | None" = None) -> FastAPI:  # fmt: skip
    """The FastAPI application over ``manager``, guarded by ``token``; every request is logged
    to ``meshrl.gateway.access`` and appended to ``access_log_file`` when given."""
    if not token:
        raise ValueError("the gateway needs a non-empty token")
    expected = token.encode()
    bearer = HTTPBearer(auto_error=False, description="the gateway token (`--token` / MESHRL_GATEWAY_TOKEN)")

    def require_token(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        given = creds.credentials.encode("utf-8", "surrogatepass") if creds is not None else b""
        if creds is None or not hmac.compare_digest(given, expected):
            raise HTTPException(
                401, "missing or wrong bearer token (send `Authorization: Bearer <token>`)",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip

    auth = [Depends(require_token)]
    app = FastAPI(
        title=title,
        version="1",
        description="Submit, list, control and watch meshrl jobs. Every `/v1` call needs a bearer token.",
        docs_url=None,
        redoc_url=None,
    )
    app.mount("/static", StaticFiles(directory=static_dir()), name="static")
    write = access_log_file if isinstance(access_log_file, AccessLogFile) else AccessLogFile(access_log_file)

    @app.middleware("http")
    async def _access(request: Request, call_next: Any) -> Response:
        t0 = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            client = request.client.host if request.client else "-"
            line = (f'{client} "{request.method} {request.url.path}" {status} '
                    f"{(time.perf_counter() - t0) * 1000:.1f}ms")  # fmt: skip
            write(line)

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json", title=f"{title} - Swagger UI",
            swagger_js_url="/static/swagger-ui-bundle.js", swagger_css_url="/static/swagger-ui.css",
            swagger_favicon_url="/static/favicon.png",
        )  # fmt: skip

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{title} - ReDoc",
                              redoc_js_url="/static/redoc.standalone.js", redoc_favicon_url="/static/favicon.png",
                              with_google_fonts=False)  # fmt: skip
    registry = CollectorRegistry()
    jobs_gauge = Gauge("meshrl_gateway_jobs", "Jobs known to the gateway, by state", ["state"], registry=registry)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=422)

    # -- probes, metrics, dashboard ------------------------------------------------------------------------------

    @app.get("/health", tags=["probes"], summary="process is alive")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", tags=["probes"], summary="the job store answers", responses={503: {"model": ErrorBody}})
    def ready() -> dict[str, Any]:
        try:
            version = manager.store.version()
        except Exception as exc:  # the database being down is the one 5xx: not ready
            raise HTTPException(503, f"job store not reachable: {exc}") from None
        return {"status": "ready", "schema_version": version}

    @app.get("/metrics", tags=["probes"], dependencies=auth, responses=_ERRORS, response_class=Response)
    def metrics() -> Response:
        counts = {s: 0 for s in JobStateName.__args__}  # type: ignore[attr-defined]
        rows = manager.store.list(limit=10_000)
        for row in rows:
            counts[row.state] = counts.get(row.state, 0) + 1
        for state, n in counts.items():
            jobs_gauge.labels(state=state).set(n)
        # + the job-level series of the jobs it runs (services/gateway/job_metrics.py)
        return Response(generate_latest(registry) + job_metrics_text(rows), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    @app.get("/dashboard", tags=["dashboard"], response_class=HTMLResponse, summary="live dashboard page")
    def dashboard() -> HTMLResponse:
        return HTMLResponse(DASHBOARD_HTML)

    # -- jobs ------------------------------------------------------------------------------------------------

    @app.post(
        "/v1/jobs",
        tags=["jobs"],
        status_code=201,
        response_model=Job,
        dependencies=auth,
        summary="submit a job",
        responses={**_ERRORS, 400: {"model": ErrorBody, "description": "bad spec: names each bad field"},
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
    async def submit(request: Request) -> dict[str, Any]:
        body = bytearray()
        async for chunk in request.stream():  # stop reading as soon as the bound is passed
            body += chunk
            if len(body) > MAX_SPEC_BYTES:
                raise HTTPException(413, f"request body over {MAX_SPEC_BYTES} bytes")
        body = bytes(body)
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "application/json":
            try:
                sub = JobSubmit.model_validate_json(body)
            except ValidationError as exc:
                parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()]
                raise HTTPException(400, "; ".join(parts)) from None
            spec, overrides = sub.spec, sub.overrides
        elif ctype in _YAML_TYPES:
            try:
                spec = body.decode("utf-8")
            except UnicodeDecodeError:
                raise HTTPException(400, "spec: the YAML body is not UTF-8") from None
            overrides = request.query_params.getlist("override")
        else:
            raise HTTPException(
                415, f"send the spec as application/json or application/yaml, not {ctype[:100] or 'nothing'!r}"
            )
        try:
            row = await _in_thread(manager.submit, spec, overrides)
        except SpecRejected as exc:
            raise HTTPException(400, str(exc)) from None
        return job_to_dict(row)

    @app.get("/v1/jobs", tags=["jobs"], response_model=JobList, dependencies=auth, responses=_ERRORS,
             summary="list jobs, newest first")  # fmt: skip
    def list_jobs(
        state: Annotated[JobStateName | None, Query(description="only jobs in this state")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    ) -> dict[str, Any]:
        return {"jobs": [job_to_dict(r) for r in manager.list(state=state, limit=limit, offset=offset)]}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], response_model=Job, dependencies=auth, responses=_ERRORS,
             summary="one job, with its resolved spec")  # fmt: skip
    def get_job(job_id: JobId) -> dict[str, Any]:
        return job_to_dict(_found(manager.get, job_id), with_spec=True)

    @app.get("/v1/jobs/{job_id}/metrics", tags=["jobs"], response_model=JobMetrics, dependencies=auth,
             responses=_ERRORS, summary="the job's metric series (for curves)")  # fmt: skip
    def job_metrics(
        job_id: JobId,
        since: Annotated[float, Query(ge=0, le=1e12, allow_inf_nan=False, description="only points after this ts")] = 0.0,
    ) -> dict[str, Any]:
        return _found(manager.metrics, job_id, since=since)

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"], response_model=JobEvents, dependencies=auth,
             responses=_ERRORS, summary="the job's lifecycle events, oldest first")  # fmt: skip
    def job_events(
        job_id: JobId,
        since: Annotated[float, Query(ge=0, le=1e12, allow_inf_nan=False, description="only events after this ts")] = 0.0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        return _found(manager.events, job_id, since=since, limit=limit)

    @app.get(
        "/v1/jobs/{job_id}/logs", tags=["jobs"], dependencies=auth, response_class=StreamingResponse,
        summary="a service's log: the last lines, optionally followed",
        responses={**_ERRORS, 200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                    "description": "log text; header `X-Log-Services` lists the job's logs"}},
    )  # fmt: skip
    def job_logs(
        job_id: JobId,
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
        except UnknownLog as exc:
            raise HTTPException(404, str(exc)) from None
        except JobNotFound as exc:
            raise HTTPException(404, str(exc)) from None
        async def body() -> Any:
            # Each read runs in a worker thread and returns within the follow poll (empty
            # chunks are ticks), so a client that hangs up frees its thread at once.
            from starlette.concurrency import run_in_threadpool

            while (chunk := await run_in_threadpool(next, chunks, None)) is not None:
                if chunk:
                    yield chunk

        return StreamingResponse(body(), media_type="text/plain; charset=utf-8",
                                 headers={"X-Log-Services": ",".join(names), "Cache-Control": "no-store"})  # fmt: skip

    def action_route(verb: str, fn: Any, doc: str) -> None:
        @app.post(f"/v1/jobs/{{job_id}}:{verb}", tags=["jobs"], response_model=Job, dependencies=auth,
                  responses=_ERRORS, summary=doc, name=f"{verb}_job")  # fmt: skip
        def _action(job_id: JobId) -> dict[str, Any]:
            return job_to_dict(_found(fn, job_id))

    action_route("cancel", manager.cancel, "cancel a job (terminate, then kill after a timeout)")
    action_route("pause", manager.pause, "pause a running job")
    action_route("resume", manager.resume, "resume a paused job")
    return app


def _found(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except JobNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except JobConflict as exc:
        raise HTTPException(409, str(exc)) from None


async def _in_thread(fn: Any, *args: Any) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


__all__ = ["create_app"]
