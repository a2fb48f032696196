"""The interface of the gateway's job launchers.

A launcher turns a validated job spec into a running job and answers for it:

    launcher = make_launcher("local")                       # registry.py: kind -> implementation
    handle = launcher.start(job_id, spec_yaml, run_dir)     # returns at once
    launcher.status(handle)   -> JobStatus(state, detail, exit_code, metrics_url)
    launcher.pause(handle); launcher.resume(handle); launcher.cancel(handle, timeout=30)

``handle`` is a small JSON-able dict the caller stores (the gateway keeps it in its
database), so a restarted gateway can find and control jobs it started before.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class JobState(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class JobStatus:
    state: JobState
    detail: str = ""  # human-readable: which service failed and why, progress, ...
    exit_code: int | None = None
    metrics_url: str | None = None  # the controller's /metrics (job-level metrics)
    progress: dict[str, Any] = field(default_factory=dict)  # step, reward_mean, staleness, tokens_per_s


class LaunchError(RuntimeError):
    """The launcher could not start or control a job (the message says why)."""


class Launcher(abc.ABC):
    """Starts and controls the services of jobs. Implementations must never block for
    longer than their stated timeouts."""

    kind: str

    @abc.abstractmethod
    def start(self, job_id: str, spec_yaml: str, run_dir: Path) -> dict[str, Any]:
        """Start the job described by ``spec_yaml`` (already validated); return a handle."""

    @abc.abstractmethod
    def status(self, handle: dict[str, Any]) -> JobStatus:
        """The job's current state; never raises for a job that merely died."""

    @abc.abstractmethod
    def pause(self, handle: dict[str, Any]) -> None:
        """Stop making progress (no new prompts, no steps) until resumed."""

    @abc.abstractmethod
    def resume(self, handle: dict[str, Any]) -> None:
        """Undo :meth:`pause`."""

    @abc.abstractmethod
    def cancel(self, handle: dict[str, Any], timeout: float = 30.0) -> None:
        """Stop every service of the job: terminate, then kill after ``timeout``."""

