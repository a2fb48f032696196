"""Ray Serve for a job's live policy: an OpenAI-compatible application.

Each Serve replica of :class:`PolicyDeployment` is a rollout replica without the stream loop
(:class:`rollout_svc.openai_api.PolicyServer`: the replicas' vLLM engine and weight-channel
subscriber), started from the job's rollout view; it joins the job's weight channel like any
replica, so its answers follow the training. Routes: ``GET /v1/models``,
``POST /v1/completions``, ``POST /v1/chat/completions`` (and ``GET /health``).

One command, the Ray way (the application builder :func:`build`)::

    serve run rollout_svc.ray_serve:build run_dir=runs/job1            # blocks; Ctrl-C removes it
    serve deploy serve.yaml      # import_path: rollout_svc.ray_serve:build, args: {run_dir: ...}

or from Python / ``meshrl serve``: :func:`deploy` (returns once the application answers).

Args of :func:`build` (all strings, as ``serve run`` passes them): ``run_dir`` (the job's run
directory: ``config/rollout-0.yaml`` and ``job.credential`` are read from it), or ``view``
and ``credential`` explicitly; ``model_name`` (default: the run directory's name);
``num_replicas`` (default 1), or ``min_replicas``/``max_replicas`` for Serve's autoscaling
(``target_ongoing_requests`` default 8); ``num_cpus`` per replica (default 1); ``num_gpus``
(default: 1 for a ``cuda`` view, else 0); ``api_key_file`` (a file holding the key clients must
send as ``Authorization: Bearer <key>``; none: no check).
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from rollout_svc.openai_api import OpenAIError, PolicyServer

log = logging.getLogger(__name__)

APP_NAME = "meshrl-policy"
DEFAULT_VIEW = Path("config") / "rollout-0.yaml"
ROUTE_WAIT_S = 30.0

app = FastAPI(title="meshrl live policy (OpenAI-compatible)", docs_url=None, redoc_url=None)


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise OpenAIError(400, "the request body is not JSON") from None


def _error(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _answer(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers={"x-meshrl-policy-version": str(body["policy_version"])})


def _read_api_key(path: str) -> str:
    key = Path(path).read_text().strip()
    if not 16 <= len(key) <= 1024 or any(c.isspace() for c in key):
        raise ServeSetupError(f"{path}: an API key is 16..1024 characters without spaces")
    return key


class ServeSetupError(ValueError):
    """The application's arguments are wrong (the message says what to fix)."""


class ServeFailed(RuntimeError):
    """The application did not come up (Serve's own message, or the deadline)."""


# Serve pickles the class below as the module is imported: every module-level name its
# methods use must be defined above it.
@serve.deployment(name="policy", ray_actor_options={"num_cpus": 1}, health_check_period_s=10,
                  health_check_timeout_s=60, graceful_shutdown_timeout_s=30)  # fmt: skip
@serve.ingress(app)
class PolicyDeployment:
    """One Serve replica: a vLLM engine on the job's current policy (see the module docstring)."""

    async def __init__(self, view_yaml: str, model_name: str, credential_file: str | None = None,
                       api_key_file: str | None = None) -> None:
        from services import auth
        from services.config.views import RolloutView

        self.api_key = _read_api_key(api_key_file) if api_key_file else None

        if credential_file:
            auth.install(credential_file)  # before vLLM starts: its worker reaches the publisher with it
        view = RolloutView.model_validate(yaml.safe_load(view_yaml))
        try:
            rid = serve.get_replica_context().replica_id.unique_id
        except Exception:  # noqa: BLE001 - outside a Serve replica (never in practice)
            rid = uuid.uuid4().hex[:8]
        self.server = PolicyServer(view, model_name=model_name, name=f"serve-{rid}")
        await self.server.start()

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {self.api_key}".encode()):
            raise OpenAIError(401, "missing or wrong API key (Authorization: Bearer <key>)",
                              kind="authentication_error")  # fmt: skip

    @app.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        try:
            self._authorize(request)
        except OpenAIError as exc:
            return _error(exc)
        return JSONResponse(self.server.models())

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> JSONResponse:
        try:
            self._authorize(request)
            return _answer(await self.server.completions(await _json(request)))
        except OpenAIError as exc:
            return _error(exc)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> JSONResponse:
        try:
            self._authorize(request)
            return _answer(await self.server.chat(await _json(request)))
        except OpenAIError as exc:
            return _error(exc)

    @app.get("/health")
    async def health(self) -> JSONResponse:
        why = self.server.healthy()
        return JSONResponse({"ok": not why, "detail": why, "policy_version": self.server.version},
                            status_code=503 if why else 200)

    async def check_health(self) -> None:
        """Serve's own probe: a dead engine makes Serve replace this replica."""
        if not self.server.engine.healthy:
            raise RuntimeError("the vLLM engine died")

    async def __del__(self) -> None:
        server = getattr(self, "server", None)  # (Serve calls this after a failed __init__ too)
        if server is not None:
            await server.close()


# ---------------------------------------------------------------------------------------------------------------
# Building and deploying the application


def build(args: dict[str, Any]) -> serve.Application:
    """The Serve application for ``args`` (see the module docstring); ``serve run`` calls this."""
    from services.config.views import RolloutView

    args = dict(args)
    known = {"run_dir", "view", "credential", "model_name", "num_replicas", "min_replicas", "max_replicas",
             "target_ongoing_requests", "num_cpus", "num_gpus", "api_key_file"}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ServeSetupError(f"unknown argument(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    run_dir = Path(args["run_dir"]) if args.get("run_dir") else None
    if run_dir is None and not args.get("view"):
        raise ServeSetupError("give run_dir=<the job's run directory> (or view=<a rollout view file>)")
    view_path = Path(args.get("view") or run_dir / DEFAULT_VIEW)
    if not view_path.is_file():
        raise ServeSetupError(f"{view_path}: no rollout view there (meshrl run writes <run_dir>/{DEFAULT_VIEW} when "
                              "the job starts its first replica)")
    text = view_path.read_text()
    try:
        view = RolloutView.model_validate(yaml.safe_load(text))
    except Exception as exc:  # noqa: BLE001 - pydantic's message names the key
        raise ServeSetupError(f"{view_path} is not a rollout view: {exc}") from None
    cred = args.get("credential") or (str(run_dir / "job.credential") if run_dir is not None else None)
    if cred is not None and not Path(cred).is_file():
        raise ServeSetupError(f"{cred}: no job credential there (the weight channel refuses calls without it)")
    model_name = args.get("model_name") or (run_dir.resolve().name if run_dir is not None else "policy")
    options: dict[str, Any] = {"ray_actor_options": {
        "num_cpus": float(args.get("num_cpus", 1)),
        "num_gpus": float(args.get("num_gpus", 1 if view.resources.device == "cuda" else 0)),
        # one vLLM CPU engine per replica process: its threads are set by vLLM, not OpenMP's default
        "runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}},
    }}
    if args.get("min_replicas") is not None or args.get("max_replicas") is not None:
        lo, hi = int(args.get("min_replicas", 1)), int(args.get("max_replicas", args.get("min_replicas", 1)))
        if not 0 <= lo <= hi or hi < 1:
            raise ServeSetupError(f"min_replicas={lo} / max_replicas={hi}: need 0 <= min <= max and max >= 1")
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi,
                                         "target_ongoing_requests": float(args.get("target_ongoing_requests", 8))}
    else:
        options["num_replicas"] = int(args.get("num_replicas", 1))
    key_file = args.get("api_key_file")
    if key_file:
        _read_api_key(key_file)  # refused here, not in every replica
        key_file = str(Path(key_file).resolve())
    return PolicyDeployment.options(**options).bind(text, model_name, str(Path(cred).resolve()) if cred else None,
                                                    key_file)


def deploy(args: dict[str, Any], *, address: str | None = None, host: str = "127.0.0.1", port: int = 8000,
           app_name: str = APP_NAME, route_prefix: str = "/", proxy_location: str | None = None,
           timeout_s: float = 900.0) -> str:
    """Connect to the Ray cluster at ``address`` (default ``$RAY_ADDRESS`` / ``auto``), start
    Serve's HTTP proxy on ``host:port`` if Serve is not running yet, deploy :func:`build`
    (``args``) as ``app_name`` and wait (at most ``timeout_s``) until it runs; its base URL."""
    import os

    import ray

    application = build(args)
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False,
                 configure_logging=False)  # fmt: skip
    serve.start(http_options={"host": host, "port": int(port)},
                **({"proxy_location": proxy_location} if proxy_location else {}))
    serve.run_many([serve.RunTarget(application, name=app_name, route_prefix=route_prefix)],
                   wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    deadline = time.monotonic() + timeout_s
    status, running_since = None, 0.0
    while time.monotonic() < deadline:
        status = serve.status().applications.get(app_name)
        if status is not None and status.status == "RUNNING":
            url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{int(port)}{route_prefix.rstrip('/')}"
            running_since = running_since or time.monotonic()
            # the proxy learns the route a moment after the replicas run (one not on this machine
            # -- HeadOnly on a remote head -- is not waited for long)
            if _answers(f"{url}/v1/models") or time.monotonic() - running_since > ROUTE_WAIT_S:
                return url
        if status is not None and status.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            detail = "; ".join(f"{name}: {d.message}" for name, d in status.deployments.items() if d.message)
            raise ServeFailed(f"Serve application {app_name} failed: {status.message or detail}")
        time.sleep(1.0)
    raise ServeFailed(f"Serve application {app_name} not running within {timeout_s:g}s "
                      f"(last status: {getattr(status, 'status', 'not created')}; see `serve status`)")


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401  # the application's own answer (an API key is set)
    except (urllib.error.URLError, OSError):
        return False


def undeploy(app_name: str = APP_NAME) -> None:
    """Delete the application (its replicas stop their engines)."""
    serve.delete(app_name)
