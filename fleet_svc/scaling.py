"""How many replicas a fleet runs: its scaling policy (docs/fleet.md, "Scaling").

Every ``scaling.interval_s`` the fleet reads its signals into a :class:`FleetSignals` and asks
its :class:`ScalingPolicy` for a :class:`Decision`: add a replica, drain one, or hold, with
the reason (also the label of ``meshrl_fleet_scale_decisions_total``). The policy only
decides; the fleet (:mod:`fleet_svc.fleet`) starts and drains replicas.

The signals come from the jobs attached to the fleet: each job's controller writes
``jobs/<job>/load.json`` when it observes the job (its ``prompts`` queue
depth, the groups its replicas hold, the trainer's time waiting for samples, samples
dropped as stale, tokens/s; :class:`services.fleets.JobLoad`); the fleet sums them over the jobs
whose file is fresh.

:class:`BacklogPolicy` (the default) adds a replica when the prompt groups waiting per
serving replica (not generated yet: queued, or leased and generating), averaged over the last
``up_after_s``, are at or above ``up_backlog``; drains one when their mean over the last
``down_after_s`` is at or below ``down_backlog`` (and the trainers did not wait for samples
most of that time); and goes back to ``min_replicas`` at once when no job has been attached
for ``down_after_s``. Hysteresis is the gap between the two thresholds and the time each
must hold; the cool-down allows at most one change per ``cooldown_s``, counted from the
moment the last change was done (a replica serving, or gone): while a replica starts or
drains the policy holds and forgets the readings, whose meaning the change alters.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from services.fleets import JobLoad, job_load  # noqa: F401  (job_load: the fleet reads the jobs' files with it)

#: a job's ``load.json`` older than this many seconds is not counted (its controller is gone)
LOAD_FRESH_S = 30.0

#: every reason a decision may give (the label values of ``meshrl_fleet_scale_decisions_total``)
REASONS = ("backlog_high", "backlog_low", "idle", "below_min", "above_max")


@dataclass
class FleetSignals:
    """What the fleet knows of its load at one reading."""

    now: float
    serving: int  # replicas serving (ready, not draining)
    changing: int = 0  # replicas starting or draining
    jobs: int = 0  # jobs attached
    backlog: float = 0.0  # prompt groups not generated yet (queued, or leased and generating), all jobs
    trainer_wait: float = 0.0  # largest share of the last interval a job's trainer waited for samples (0..1)
    dropped_stale_per_s: float = 0.0  # samples dropped as stale per second, summed over the jobs
    tokens_per_s: float = 0.0  # generated tokens per second, summed over the jobs

    @property
    def backlog_per_replica(self) -> float:
        return self.backlog / max(1, self.serving)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "backlog_per_replica": round(self.backlog_per_replica, 3)}


@dataclass(frozen=True)
class Decision:
    """``action``: ``add`` | ``remove`` | ``hold``; ``reason``: one of :data:`REASONS` (or why
    it holds, for the log); ``count``: replicas to add or drain."""

    action: str
    reason: str
    count: int = 0


HOLD = Decision("hold", "")


class ScalingPolicy:
    """The interface: :meth:`decide` is called every reading with the fleet's signals and the
    bounds; :meth:`changed` once a decision was carried out."""

    name = "base"

    def decide(self, s: FleetSignals, lo: int, hi: int) -> Decision:
        return HOLD

    def changed(self, now: float) -> None:
        """A replica was added or drained at ``now`` (starts the cool-down)."""


@dataclass
class BacklogPolicy(ScalingPolicy):
    """Scale on the backlog per replica, with hysteresis and a cool-down (see module doc).

    The backlog of a running job is a sawtooth (its window refills after each step, then
    drains as the replicas generate), so the policy judges the **mean** of its readings over
    ``up_after_s`` (adding) and ``down_after_s`` (draining), once it has watched that long
    since it started or last changed the count."""

    up_backlog: float = 16.0
    down_backlog: float = 4.0
    up_after_s: float = 6.0
    down_after_s: float = 20.0
    cooldown_s: float = 20.0
    starved: float = 0.5  # a trainer waiting this share of the time blocks a drain
    name: str = "backlog"
    last_change: float | None = None
    _seen: deque = field(default_factory=deque, repr=False)  # (now, backlog per replica, trainer wait)
    _idle_since: float | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg: Any) -> "BacklogPolicy":
        return cls(up_backlog=cfg.up_backlog, down_backlog=cfg.down_backlog, up_after_s=cfg.up_after_s,
                   down_after_s=cfg.down_after_s, cooldown_s=cfg.cooldown_s)

    def changed(self, now: float) -> None:
        self.last_change = now
        self._seen.clear()  # the backlog per replica means something else now

    def _mean(self, now: float, window: float) -> tuple[float, float] | None:
        """Mean backlog per replica and trainer wait over the last ``window`` seconds; None
        until the readings cover it."""
        if not self._seen or self._seen[0][0] > now - window:
            return None
        recent = [(b, w) for t, b, w in self._seen if t >= now - window]
        return sum(b for b, _ in recent) / len(recent), sum(w for _, w in recent) / len(recent)

    def decide(self, s: FleetSignals, lo: int, hi: int) -> Decision:
        now = s.now
        self._seen.append((now, s.backlog_per_replica, s.trainer_wait))
        longest = max(self.up_after_s, self.down_after_s)
        while len(self._seen) > 1 and self._seen[1][0] <= now - longest:
            self._seen.popleft()  # keep one reading at or before the longest window's start
        self._idle_since = _since(self._idle_since, s.jobs == 0, now)
        total = s.serving + s.changing
        if s.changing:  # the cool-down and the windows count from the moment the change is done
            self.changed(now)
            return Decision("hold", "a replica is starting or draining")
        if total < lo:
            return Decision("add", "below_min", lo - total)
        if total > hi:
            return Decision("remove", "above_max", total - hi)
        if self.last_change is not None and now - self.last_change < self.cooldown_s:
            return Decision("hold", "cooling down")
        if self._idle_since is not None and now - self._idle_since >= self.down_after_s:
            return Decision("remove", "idle", total - lo) if total > lo else HOLD
        up = self._mean(now, self.up_after_s)
        if s.jobs and up is not None and up[0] >= self.up_backlog and total < hi:
            return Decision("add", "backlog_high", 1)
        down = self._mean(now, self.down_after_s)
        if down is not None and down[0] <= self.down_backlog and down[1] < self.starved and total > lo:
            return Decision("remove", "backlog_low", 1)
        return HOLD


def _since(since: float | None, holds: bool, now: float) -> float | None:
    """When a condition started holding (kept while it holds), None once it does not."""
    if not holds:
        return None
    return now if since is None else since


class SignalReader:
    """Turns the jobs' load files into :class:`FleetSignals`: sums, and rates between a job's
    two last readings (kept while its file has not changed)."""

    def __init__(self) -> None:
        self._last: dict[str, JobLoad] = {}
        self._rates: dict[str, tuple[float, float]] = {}  # job -> (trainer wait share, stale drops/s)

    def read(self, loads: dict[str, JobLoad | None], *, now: float, wall: float, serving: int,
             changing: int) -> FleetSignals:
        s = FleetSignals(now=now, serving=serving, changing=changing, jobs=len(loads))
        for job in set(self._last) - set(loads):
            self._last.pop(job, None)
            self._rates.pop(job, None)
        for job, load in loads.items():
            if load is None or wall - load.time > LOAD_FRESH_S:
                continue
            s.backlog += load.backlog
            s.tokens_per_s += load.tokens_per_s
            prev = self._last.get(job)
            if prev is not None and load.time > prev.time:
                dt = load.time - prev.time
                self._rates[job] = (min(1.0, max(0.0, load.trainer_wait_s - prev.trainer_wait_s) / dt),
                                    max(0.0, load.dropped_stale - prev.dropped_stale) / dt)
            if prev is None or load.time > prev.time:
                self._last[job] = load
            wait, stale = self._rates.get(job, (0.0, 0.0))
            s.trainer_wait = max(s.trainer_wait, wait)
            s.dropped_stale_per_s += stale
        return s
