"""What the gateway's routes share: the token check, the job manager, error shapes.

Both dependencies read ``request.app.state`` (``token``: the expected bearer token as bytes;
``manager``: the :class:`~gateway_svc.jobs.JobManager`), which ``create_app`` sets.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from gateway_svc.jobs import JobConflict, JobManager, JobNotFound
from gateway_svc.models import ErrorBody
from gateway_svc.spec_validation import MAX_SPEC_BYTES

bearer = HTTPBearer(auto_error=False, description="the gateway token (`--token` / MESHRL_GATEWAY_TOKEN)")


def require_token(request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """401 unless the request carries the app's bearer token (compared in constant time)."""
    given = creds.credentials.encode("utf-8", "surrogatepass") if creds is not None else b""
    if creds is None or not hmac.compare_digest(given, request.app.state.token):
        raise HTTPException(
            401, "missing or wrong bearer token (send `Authorization: Bearer <token>`)",
            headers={"WWW-Authenticate": "Bearer"},
        )  # fmt: skip


async def job_manager(request: Request) -> JobManager:
    """The app's job manager (async: FastAPI calls it on the event loop, no worker thread)."""
    return request.app.state.manager


AUTH = [Depends(require_token)]
Manager = Annotated[JobManager, Depends(job_manager)]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "missing or wrong bearer token"},
    404: {"model": ErrorBody, "description": "no such job"},
    409: {"model": ErrorBody, "description": "the job's state does not allow this"},
}
JobId = Annotated[str, Path(min_length=1, max_length=128, description="job id from `POST /v1/jobs`")]


def found(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its unknown job a 404 and its state conflict a 409."""
    try:
        return fn(*args, **kwargs)
    except JobNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except JobConflict as exc:
        raise HTTPException(409, str(exc)) from None


YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")


async def read_spec_body(request: Request, body_model: type[BaseModel]) -> tuple[Any, list[str]]:
    """(spec, overrides) of a submit: JSON ``body_model`` (``spec`` and ``overrides``), or the
    YAML file itself with ``?override=`` query parameters. 413 over ``MAX_SPEC_BYTES`` (read
    no further), 415 another content type, 400 a body that is not one of the two."""
    body = bytearray()
    async for chunk in request.stream():  # stop reading as soon as the bound is passed
        body += chunk
        if len(body) > MAX_SPEC_BYTES:
            raise HTTPException(413, f"request body over {MAX_SPEC_BYTES} bytes")
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        try:
            sub = body_model.model_validate_json(bytes(body))
        except ValidationError as exc:
            parts = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()]
            raise HTTPException(400, "; ".join(parts)) from None
        return sub.spec, sub.overrides  # type: ignore[attr-defined]
    if ctype in YAML_TYPES:
        try:
            return bytes(body).decode("utf-8"), request.query_params.getlist("override")
        except UnicodeDecodeError:
            raise HTTPException(400, "spec: the YAML body is not UTF-8") from None
    raise HTTPException(415, f"send the spec as application/json or application/yaml, not {ctype[:100] or 'nothing'!r}")
