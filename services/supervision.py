"""The restart policy of a job's services, the same for every launcher.

A launcher (``meshrl run``'s controller, a Ray launcher) owns processes; this module owns
the decisions, so every launcher applies the same rules:

* **A crash is restarted** -- a service that exits (any exit of a rollout replica, reward
  worker or feeder; a non-zero exit of the trainer) is started again after a backoff
  (``backoff_s``, doubling per restart of that service up to ``backoff_max_s``), at most
  ``max_restarts`` times per service over the job. The trainer restarts from its last
  checkpoint; the others' leased work goes back to their queue and is redone. The rest of
  the mesh keeps running meanwhile.
* **Stuck counts as crashed** -- a running service whose health probe has not answered for
  ``heartbeat_timeout_s`` is killed by its launcher and then handled as a crash; so is a
  rollout replica whose served policy version stays more than ``async.max_staleness``
  away from the trainer's for as long (its weight channel is wedged: everything it
  generates would be dropped as stale). A restarted replica loads the current weights.
* **The job fails** only when a service exhausts its budget; the reason names the service,
  how it ended, and how many restarts it had.
* **No silent stall** -- the launcher reports the job's progress counters (samples
  generated, scored, trained ...); with no change for ``stall_warn_s`` the status says the
  job is stalled and on what, past ``stall_timeout_s`` the job fails with that reason.

Pure bookkeeping (no processes, no I/O): time comes in as ``now`` (``time.monotonic``).

    sup = Supervisor(spec.services.restart, ["trainer", "reward-0", "rollout-0"])
    sup.started("rollout-0", now)
    d = sup.exited("rollout-0", "exited with code -9", now)
    if d.action == "fail": fail_job(d.reason)
    else: restart_after(d.delay_s)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from services.config.restart import RestartConfig

__all__ = ["Decision", "RestartConfig", "Stall", "Supervisor", "resume_warnings", "stall_reason"]


def resume_warnings(spec: Any) -> list[str]:
    """What a job spec gives up of exact resume (one line each; ``meshrl validate`` and
    ``meshrl run`` print them). The trainer defers its acks to its checkpoints only with
    ``trainer.save_freq > 0``; without that, a trainer the supervisor restarts after a crash
    resumes from its last checkpoint (written only at a stop or the end) while the samples
    of the steps trained since are acked already: those steps are lost."""
    out = []
    if spec.services.restart.max_restarts > 0 and spec.trainer.save_freq <= 0:
        out.append(f"trainer.save_freq: {spec.trainer.save_freq} checkpoints only at a stop or the end, so a trainer "
                   f"restarted after a crash (services.restart.max_restarts={spec.services.restart.max_restarts}) "
                   "loses the steps trained since its last checkpoint (their samples are acked already); set "
                   "trainer.save_freq > 0 for exact resume (docs/supervision.md)")
    return out


@dataclass
class Decision:
    """What to do about an exited service: ``restart`` after ``delay_s``, or ``fail`` the job."""

    action: Literal["restart", "fail"]
    delay_s: float = 0.0
    reason: str = ""


@dataclass
class ServiceRecord:
    """Supervision state of one service (by name, across its incarnations)."""

    name: str
    restarts: int = 0
    running: bool = False
    last_beat: float = 0.0
    last_exit: str = ""
    history: list[str] = field(default_factory=list)
    lag_since: float | None = None  # since when its served version is too far from the trainer's
    lag: str = ""


@dataclass
class Stall:
    """The job made no progress for ``seconds``; ``fatal`` once past ``stall_timeout_s``."""

    seconds: float
    reason: str
    fatal: bool


class Supervisor:
    """Restart budget, backoff, liveness and progress of one job's services."""

    def __init__(self, policy: RestartConfig, names: Iterable[str]) -> None:
        self.policy = policy
        self.services: dict[str, ServiceRecord] = {n: ServiceRecord(n) for n in names}
        self._progress: dict[str, float] | None = None
        self._progress_at: float | None = None

    def _rec(self, name: str) -> ServiceRecord:
        rec = self.services.get(name)
        if rec is None:
            rec = self.services[name] = ServiceRecord(name)
        return rec

    # ------------------------------------------------------------------ lifecycle

    def started(self, name: str, now: float) -> None:
        """``name`` is running (ready); its heartbeat clock starts now."""
        rec = self._rec(name)
        rec.running, rec.last_beat = True, now

    def parked(self, name: str) -> None:
        """``name`` left on purpose (a fleet drained it): no heartbeat is expected from it and
        its end is no crash; :meth:`started` again when it comes back."""
        rec = self._rec(name)
        rec.running, rec.lag_since, rec.lag = False, None, ""

    def beat(self, name: str, now: float) -> None:
        """``name`` answered its health probe."""
        rec = self._rec(name)
        rec.last_beat = max(rec.last_beat, now)

    def versions(self, current: float | None, served: Mapping[str, float | None], allowed: int, now: float) -> None:
        """The trainer's policy version and each replica's served one (None: unknown)."""
        for name, v in served.items():
            rec = self._rec(name)
            if current is None or v is None or abs(current - v) <= allowed:
                rec.lag_since, rec.lag = None, ""
            else:
                if rec.lag_since is None:
                    rec.lag_since = now
                rec.lag = (f"serves policy version {v:g} while the trainer is at {current:g} "
                           f"(more than async.max_staleness={allowed} apart)")

    def stuck(self, now: float) -> list[tuple[str, str]]:
        """Running services silent, or serving too old a version, past ``heartbeat_timeout_s``:
        (name, reason) each."""
        out = []
        limit = self.policy.heartbeat_timeout_s
        for rec in self.services.values():
            silent = now - rec.last_beat
            if rec.running and silent > limit:
                out.append((rec.name, f"no heartbeat for {silent:.0f}s "
                                      f"(services.restart.heartbeat_timeout_s={limit:g})"))
            elif rec.running and rec.lag_since is not None and now - rec.lag_since > limit:
                out.append((rec.name, f"{rec.lag} for {now - rec.lag_since:.0f}s "
                                      f"(services.restart.heartbeat_timeout_s={limit:g})"))
        return out

    def exited(self, name: str, how: str, now: float) -> Decision:
        """``name`` ended (``how``: e.g. ``"exited with code -9"``): restart it or fail the job."""
        rec = self._rec(name)
        rec.running = False
        rec.lag_since = None
        rec.last_exit = how
        rec.history.append(how)
        p = self.policy
        if rec.restarts >= p.max_restarts:
            return Decision("fail", reason=(
                f"{name} {how}; it was restarted {rec.restarts} time(s), the budget is "
                f"services.restart.max_restarts={p.max_restarts}"))
        delay = min(p.backoff_max_s, p.backoff_s * (2 ** rec.restarts))
        rec.restarts += 1
        # the job is not stalled while a service is coming back
        if self._progress_at is not None:
            self._progress_at = max(self._progress_at, now)
        return Decision("restart", delay_s=delay, reason=f"{name} {how}; restart {rec.restarts}/{p.max_restarts} in {delay:g}s")

    def restarts(self) -> dict[str, int]:
        return {n: r.restarts for n, r in self.services.items()}

    # ------------------------------------------------------------------ progress

    def progress(self, counters: Mapping[str, float], now: float) -> None:
        """The job's monotone progress counters (samples generated, scored, trained ...)."""
        snap = {k: float(v) for k, v in counters.items()}
        if self._progress is None or any(snap.get(k, 0.0) > self._progress.get(k, 0.0) for k in snap):
            self._progress_at = now
        self._progress = {k: max(v, (self._progress or {}).get(k, v)) for k, v in snap.items()}

    def touch(self, now: float) -> None:
        """Reset the stall clock (the job just started, or resumed)."""
        self._progress_at = now

    def stall(self, now: float, why: str) -> Stall | None:
        """A :class:`Stall` when nothing progressed for ``stall_warn_s``; ``why`` says on what."""
        if self._progress_at is None:
            self._progress_at = now
        idle = now - self._progress_at
        if idle < self.policy.stall_warn_s:
            return None
        fatal = idle >= self.policy.stall_timeout_s
        limit = (f" (services.restart.stall_timeout_s={self.policy.stall_timeout_s:g})" if fatal
                 else f"; the job fails after {self.policy.stall_timeout_s:g}s (services.restart.stall_timeout_s)")
        return Stall(idle, f"no progress for {idle:.0f}s: {why}{limit}", fatal)


def stall_reason(queues: Mapping[str, int], *, in_flight: int, max_in_flight: int,
                 restarting: Iterable[str] = (), down: Iterable[str] = ()) -> str:
    """Where a stalled job waits, from its queue depths and admission state."""
    restarting, down = list(restarting), list(down)
    if restarting:
        return f"waiting for {', '.join(restarting)} to restart"
    if down:
        return f"{', '.join(down)} not answering"
    if queues.get("experience", 0):
        return f"the trainer is not consuming 'experience' ({queues['experience']} items waiting)"
    if queues.get("rollouts", 0):
        return f"the reward workers are not scoring 'rollouts' ({queues['rollouts']} items waiting)"
    if queues.get("prompts", 0):
        return f"the rollout replicas are not generating ('prompts' holds {queues['prompts']} items)"
    if in_flight >= max_in_flight:
        return (f"every queue is empty but {in_flight} prompts count as in flight "
                f"(admission limit {max_in_flight}): the queue's ledger has not seen them trained or dropped")
    return "every queue is empty and the feeder has nothing to feed"


def decide_summary(sup: Supervisor) -> dict[str, Any]:
    """Restart counts and last exits, for status.json."""
    return {n: {"restarts": r.restarts, "last_exit": r.last_exit} for n, r in sup.services.items() if r.restarts or r.last_exit}
