"""The gateway's REST API (FastAPI): the app, its access log, and the routers it includes.

    app = create_app(manager, token="s3cret")      # uvicorn.run(app, ...)

The routes live in gateway_svc/routes/, one router per resource (jobs, what a job
produces, fleets, probes, dashboard, docs pages). Every route under ``/v1`` and ``/metrics`` needs
``Authorization: Bearer <token>`` (compared in constant time); ``/health``, ``/ready``,
``/openapi.json``, the docs pages and the dashboard page (static, it carries no data: its
script calls the API with the token you give it) are open. Every request is written to the
access log (logger ``meshrl.gateway.access``, and ``access_log`` if given): client, method,
path (no query string), status, milliseconds.
"""

import logging
import os
import time
from pathlib import Path as FilePath
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from gateway_svc.fleets import FleetManager
from gateway_svc.jobs import JobManager
from gateway_svc.redact import redact_text
from gateway_svc.routes import dashboard, docs, job_output, jobs, probes
from gateway_svc.routes import fleets as fleet_routes

access_log = logging.getLogger("meshrl.gateway.access")


class AccessLogFile:
    """Appends timestamped lines to a file (line-buffered, thread-safe) and to the
    ``meshrl.gateway.access`` logger; shared by the REST and gRPC front ends."""

    def __init__(self, path: FilePath | None) -> None:
        import threading

        self._lock = threading.Lock()
        self._f = None
        if path:  # 0600 whatever the umask: it names every job and client address
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.fchmod(fd, 0o600)
            self._f = os.fdopen(fd, "a", buffering=1)  # noqa: SIM115 (lives as long as the gateway)

    def __call__(self, line: str) -> None:
        access_log.info(redact_text(line))
        if self._f is not None:
            with self._lock:
                self._f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} {redact_text(line)}\n")

    def close(self) -> None:
        if self._f is not None:
            with self._lock:
                self._f.close()
                self._f = None


def create_app(manager: JobManager, token: str, *, title: str = "meshrl gateway",
               access_log_file: "FilePath | AccessLogFile | None" = None,
               fleets: "FleetManager | None" = None) -> FastAPI:  # fmt: skip
    """The FastAPI application over ``manager`` (and ``fleets``: without it the fleet routes
    answer 404), guarded by ``token``; every request is logged to ``meshrl.gateway.access``
    and appended to ``access_log_file`` when given."""
    if not token:
        raise ValueError("the gateway needs a non-empty token")
    app = FastAPI(
        title=title,
        version="1",
        description="Submit, list, control and watch meshrl jobs. Every `/v1` call needs a bearer token.",
        docs_url=None,
        redoc_url=None,
    )
    # What the routes' dependencies read (gateway_svc/routes/deps.py).
    app.state.manager = manager
    app.state.fleets = fleets
    app.state.token = token.encode()
    app.state.metrics = probes.GatewayMetrics()
    log = access_log_file if isinstance(access_log_file, AccessLogFile) else AccessLogFile(access_log_file)
    app.state.access_log = log
    app.mount("/static", StaticFiles(directory=docs.static_dir()), name="static")
    app.middleware("http")(_log_access)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    for router in (docs.router, probes.router, dashboard.router, jobs.router, job_output.router, fleet_routes.router):
        app.include_router(router)
    return app


async def _log_access(request: Request, call_next: Any) -> Response:
    """Write one access-log line per request, whatever its outcome (500 if it raised)."""
    t0 = time.perf_counter()
    status = 500
    try:
        response = await call_next(request)
        status = response.status_code
        return response
    finally:
        client = request.client.host if request.client else "-"
        request.app.state.access_log(f'{client} "{request.method} {request.url.path}" {status} '
                                     f"{(time.perf_counter() - t0) * 1000:.1f}ms")  # fmt: skip


async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A request FastAPI could not validate: a 422 naming each bad part in one ``detail``."""
    parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=422)


__all__ = ["create_app"]
