"""Run the gateway: REST (uvicorn) and gRPC JobService over one job manager.

    gw = Gateway(GatewaySettings(token="s3cret", runs_dir=Path("runs"))).start()
    gw.http_url, gw.grpc_address
    gw.stop()

``meshrl gateway`` (gateway_svc/main.py) builds the settings from flags and env and
blocks in :meth:`Gateway.serve_forever`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from services.sandbox.confine import WEAK_ENV

from gateway_svc.launchers.base import Launcher
from gateway_svc.launchers.registry import make_launcher

DEFAULT_HTTP_PORT = 8600
DEFAULT_GRPC_PORT = 8601


class GatewaySettings(BaseModel):
    """Everything the gateway needs (flags and env of ``meshrl gateway``)."""

    # Errors name the field and the problem, never the value: one value is the token.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    token: str = Field(repr=False, min_length=8, description="bearer token every API call must carry")
    host: str = Field("127.0.0.1", description="address REST and gRPC bind")
    port: int = Field(DEFAULT_HTTP_PORT, ge=0, le=65535, description="REST port (0 picks a free one)")
    grpc_port: int | None = Field(DEFAULT_GRPC_PORT, ge=0, le=65535, description="JobService port; None = off")
    db_url: str | None = Field(None, description="sqlite:///PATH or postgresql://...; default RUNS_DIR/gateway.db")
    runs_dir: Path = Field(Path("runs"), description="each job runs in RUNS_DIR/<job id>")
    launcher: str = Field("local", description="local, ray or deployment")
    poll_interval: float = Field(2.0, gt=0, le=3600, description="seconds between job status refreshes")
    cancel_timeout: float = Field(30.0, gt=0, le=3600, description="seconds from SIGTERM to SIGKILL on cancel")
    max_running_jobs: int | None = Field(
        None, ge=1, le=10_000, description="jobs running (or paused) at once; more wait pending, FIFO. None = no limit"
    )
    access_log: Path | None = Field(None, description="append the access log here; default RUNS_DIR/gateway-access.log")
    allow: list[str] = Field(
        default_factory=list,
        description="what submitted jobs may do beyond the defaults: trust_remote_code, network, unsandboxed_tools, "
        "bind_any, weak_sandbox (docs/security.md)",
    )
    input_roots: list[Path] | None = Field(
        None, description="directories a job's inputs may come from; None = /models and /data (docs/security.md)"
    )
    token_file: Path | None = Field(None, description="where the token was read from (no job may name it)")


#: Input roots of a gateway that names none (the compose deployment's model and data volumes).
DEFAULT_INPUT_ROOTS = (Path("/models"), Path("/data"))


class Gateway:
    """The running gateway (REST in a uvicorn thread, gRPC in its own pool)."""

    def __init__(self, settings: GatewaySettings, launcher: Launcher | None = None) -> None:
        import uvicorn

        from gateway_svc.app import create_app
        from gateway_svc.jobs import JobManager
        from gateway_svc.store import open_store

        from gateway_svc.policy import OperatorPolicy

        self.settings = settings
        self.policy = OperatorPolicy.make(settings.allow, settings.input_roots if settings.input_roots is not None
                                          else DEFAULT_INPUT_ROOTS)
        runs = settings.runs_dir.resolve()
        runs.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(runs, 0o700)  # every job's spec, credential and checkpoints; the database
        self.store = open_store(settings.db_url or f"sqlite:///{runs / 'gateway.db'}")
        self.launcher = launcher or make_launcher(settings.launcher)
        if "weak_sandbox" in self.policy.allow:  # the jobs' services inherit it (services/sandbox/confine.py)
            os.environ[WEAK_ENV] = "1"
            if hasattr(self.launcher, "env"):
                self.launcher.env[WEAK_ENV] = "1"
        excluded = [p for p in (settings.token_file, settings.access_log) if p is not None]
        if settings.db_url and settings.db_url.startswith("sqlite:///"):
            excluded.append(Path(settings.db_url[len("sqlite:///"):]))
        self.manager = JobManager(
            self.store, self.launcher, runs,
            poll_interval=settings.poll_interval, cancel_timeout=settings.cancel_timeout,
            max_running_jobs=settings.max_running_jobs, policy=self.policy, excluded_inputs=excluded,
        )  # fmt: skip
        # Fleets (docs/fleet.md): children of this gateway under RUNS_DIR/fleets, its jobs'
        # MESHRL_FLEETS_DIR, so a job naming services.rollout.fleet attaches to them.
        from gateway_svc.fleets import FleetManager, fleets_dir
        from services.fleets import FLEETS_ENV

        self.fleets = FleetManager(fleets_dir(runs), self.policy, excluded_inputs=[runs, *excluded])
        if self.launcher.kind == "local":
            self.launcher.env[FLEETS_ENV] = str(self.fleets.root)  # type: ignore[attr-defined]
        from gateway_svc.app import AccessLogFile

        self.access_log = AccessLogFile(settings.access_log or runs / "gateway-access.log")
        self.app = create_app(self.manager, settings.token, access_log_file=self.access_log, fleets=self.fleets)
        config = uvicorn.Config(
            self.app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
            timeout_graceful_shutdown=5,
        )  # fmt: skip
        self._uvicorn = uvicorn.Server(config)
        self._http_thread: threading.Thread | None = None
        self._grpc = None
        self.grpc_port: int | None = None

    @property
    def http_port(self) -> int:
        servers = getattr(self._uvicorn, "servers", None) or []
        for srv in servers:
            for sock in srv.sockets:
                return int(sock.getsockname()[1])
        return self.settings.port

    @property
    def http_url(self) -> str:
        return f"http://{self.settings.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str | None:
        return f"{self.settings.host}:{self.grpc_port}" if self.grpc_port else None

    def start(self, timeout: float = 20.0) -> "Gateway":
        """Start serving; raise if REST is not up within ``timeout`` seconds."""
        from gateway_svc.grpc_server import start_grpc

        self.manager.start()
        if self.settings.grpc_port is not None:
            self._grpc, self.grpc_port = start_grpc(
                self.manager, self.settings.token, host=self.settings.host, port=self.settings.grpc_port,
                access_log=self.access_log, fleets=self.fleets,
            )
        self._http_thread = threading.Thread(target=self._uvicorn.run, name="gateway-http", daemon=True)
        self._http_thread.start()
        ready = threading.Event()
        for _ in range(int(timeout / 0.05)):
            if self._uvicorn.started:
                return self
            if not self._http_thread.is_alive():
                break
            ready.wait(0.05)
        self.stop()
        raise RuntimeError(f"gateway REST server did not start on {self.settings.host}:{self.settings.port}")

    def serve_forever(self) -> None:
        """Block until SIGINT/SIGTERM (call from the main thread), then stop cleanly.
        Running jobs and fleets are left running: a restarted gateway finds them again."""
        import signal

        assert self._http_thread is not None

        def _stop(_signum: int, _frame: object) -> None:
            self._uvicorn.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop)
        try:
            while self._http_thread.is_alive():
                self._http_thread.join(timeout=1.0)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join(timeout=10)
        if self._grpc is not None:
            self._grpc.stop(grace=2).wait(timeout=5)
        self.manager.close()
        self.access_log.close()
