"""The Ray launcher: a job's driver runs under a Ray actor on a Ray cluster.

    launcher = RayLauncher(address="10.0.0.5:6379")          # or "auto", or $RAY_ADDRESS
    handle = launcher.start(job_id, spec_yaml, run_dir)

``start`` creates a detached, named actor (``meshrl-job-<id>`` in namespace ``meshrl``)
that Ray places on some node of the cluster; the actor runs the job exactly as the local
launcher does on that node (``meshrl run`` as one process group; pause/resume with
SIGSTOP/SIGCONT, cancel with SIGTERM then SIGKILL, status from the return code and
``status.json``) and answers ``status``/``pause``/``resume``/``cancel`` calls. The actor
is detached, so jobs outlive the gateway that started them; a restarted gateway finds an
actor again by its name (stored in the handle).

``run_dir`` must be a path the chosen node can write (shared storage on a real cluster).
Only plain strings, numbers and dicts cross Ray calls here. Ray itself serialises calls
between the processes of the cluster with its own (pickle-based) format: keep the Ray
cluster's ports private to trusted machines.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from gateway_svc.launchers.base import JobState, JobStatus, LaunchError, Launcher

ACTOR_PREFIX = "meshrl-job-"
NAMESPACE = "meshrl"


class _JobRunner:
    """The actor body: a LocalLauncher for one job, on the node Ray picked."""

    def __init__(self, command: list[str] | None, env: dict[str, str]) -> None:
        import ray

        from gateway_svc.launchers.local import LocalLauncher

        # a job with services.launcher=ray places its services on this same cluster
        env = {"RAY_ADDRESS": ray.get_runtime_context().gcs_address, **env}
        self._launcher = LocalLauncher(command=command, env=env)
        self._handle: dict[str, Any] | None = None

    def start(self, job_id: str, spec_yaml: str, run_dir: str) -> dict[str, Any]:
        self._handle = self._launcher.start(job_id, spec_yaml, Path(run_dir))
        return self._handle

    def status(self) -> dict[str, Any]:
        st = self._launcher.status(self._require())
        return {"state": st.state.value, "detail": st.detail, "exit_code": st.exit_code,
                "metrics_url": st.metrics_url, "progress": st.progress}  # fmt: skip

    def pause(self) -> None:
        self._launcher.pause(self._require())

    def resume(self) -> None:
        self._launcher.resume(self._require())

    def cancel(self, timeout: float) -> None:
        self._launcher.cancel(self._require(), timeout=timeout)

    def _require(self) -> dict[str, Any]:
        if self._handle is None:
            raise LaunchError("job not started")
        return self._handle


class RayLauncher(Launcher):
    """Runs each job's driver under a detached Ray actor (see the module docstring)."""

    kind = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        namespace: str = NAMESPACE,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        call_timeout: float = 30.0,
        num_cpus: float = 0.0,
    ) -> None:
        """``address``: the cluster (``host:port`` of the head's GCS, ``ray://...``, or
        ``auto``; default ``$RAY_ADDRESS`` or ``auto``). ``command``/``env`` as for
        :class:`~gateway_svc.launchers.local.LocalLauncher`. ``num_cpus``: what the actor itself
        reserves (0: the driver's services are not Ray tasks and manage their own CPUs)."""
        self.address = address or os.environ.get("RAY_ADDRESS", "auto")
        self.namespace = namespace
        self.command = command
        self.env = dict(env or {})
        self.call_timeout = call_timeout
        self.num_cpus = num_cpus
        self._lock = threading.Lock()
        self._ray: Any = None
        self._final: dict[str, JobStatus] = {}  # actor name -> last status, once finished or cancelled

    def _connect(self) -> Any:
        with self._lock:
            if self._ray is None:
                try:
                    import ray
                except ImportError:
                    raise LaunchError("the ray launcher needs Ray: pip install 'meshrl[ray]'") from None
                if not ray.is_initialized():
                    try:
                        ray.init(address=self.address, namespace=self.namespace, log_to_driver=False,
                                 configure_logging=False)  # fmt: skip
                    except Exception as exc:  # ConnectionError and Ray's own errors
                        raise LaunchError(f"cannot connect to the Ray cluster at {self.address!r}: {exc}") from None
                self._ray = ray
            return self._ray

    def _get(self, ref: Any) -> Any:
        ray = self._ray
        try:
            return ray.get(ref, timeout=self.call_timeout)
        except ray.exceptions.GetTimeoutError:
            raise LaunchError(f"the job's Ray actor did not answer within {self.call_timeout}s") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else exc
            raise LaunchError(str(cause).splitlines()[-1] if str(cause) else repr(cause)) from None

    def _actor(self, handle: dict[str, Any]) -> Any:
        ray = self._connect()
        try:
            return ray.get_actor(handle["actor"], namespace=handle.get("namespace", self.namespace))
        except ValueError:
            return None

    def start(self, job_id: str, spec_yaml: str, run_dir: Path) -> dict[str, Any]:
        ray = self._connect()
        name = f"{ACTOR_PREFIX}{job_id}"
        runner_cls = ray.remote(num_cpus=self.num_cpus, max_restarts=0)(_JobRunner)
        actor = runner_cls.options(name=name, namespace=self.namespace, lifetime="detached").remote(
            self.command, self.env
        )
        try:
            inner = self._get(actor.start.remote(job_id, spec_yaml, str(Path(run_dir).resolve())))
        except LaunchError:
            ray.kill(actor)
            raise
        return {"kind": self.kind, "actor": name, "namespace": self.namespace, "address": self.address,
                "run_dir": inner["run_dir"], "pid": inner["pid"]}  # fmt: skip

    def status(self, handle: dict[str, Any]) -> JobStatus:
        if handle["actor"] in self._final:
            return self._final[handle["actor"]]
        actor = self._actor(handle)
        if actor is None:
            return JobStatus(JobState.FAILED, f"the job's Ray actor {handle['actor']} is gone")
        try:
            st = self._get(actor.status.remote())
        except LaunchError as exc:
            return JobStatus(JobState.FAILED, f"the job's Ray actor failed: {exc}")
        except Exception as exc:  # RayActorError: the actor (or its node) died
            return JobStatus(JobState.FAILED, f"the job's Ray actor died: {type(exc).__name__}")
        status = JobStatus(JobState(st["state"]), st["detail"], st["exit_code"], st["metrics_url"], st["progress"])
        if status.state.finished:  # the job is over: keep its last word, free the actor's worker
            self._final[handle["actor"]] = status
            self._ray.kill(actor, no_restart=True)
        return status

    def pause(self, handle: dict[str, Any]) -> None:
        self._call(handle, "pause")

    def resume(self, handle: dict[str, Any]) -> None:
        self._call(handle, "resume")

    def cancel(self, handle: dict[str, Any], timeout: float = 30.0) -> None:
        """Stop the job (terminate, kill after ``timeout``) and remove its actor."""
        actor = self._actor(handle)
        if actor is None:
            return
        last: dict[str, Any] = {}
        try:
            self._ray.get(actor.cancel.remote(timeout), timeout=timeout + self.call_timeout)
            last = self._ray.get(actor.status.remote(), timeout=self.call_timeout)
        except Exception:
            pass  # the actor may already be dead; killing it below is what matters
        self._final[handle["actor"]] = JobStatus(
            JobState.CANCELLED, "cancelled", last.get("exit_code"), None, last.get("progress", {})
        )
        self._ray.kill(actor, no_restart=True)

    def _call(self, handle: dict[str, Any], method: str) -> None:
        actor = self._actor(handle)
        if actor is None:
            raise LaunchError(f"the job's Ray actor {handle['actor']} is gone")
        self._get(getattr(actor, method).remote())
