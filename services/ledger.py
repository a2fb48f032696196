"""The job's sample ledger: what happened to every sample, checkable from outside.

Counts (``status.json`` ``ledger``, ``summary.json``, the controller's ``/metrics`` as
``meshrl_job_ledger_samples_total{stage=...}``):

* ``fed``            samples asked for: prompts fed x ``rollout.n``
* ``generated``      samples the rollout replicas delivered (every incarnation)
* ``regenerated``    of those, generated again from a prompt redelivered after a crash
* ``scored``         samples the reward workers scored (every incarnation)
* ``trained``        samples in steps the trainer's checkpointed state holds (incl. ``failed``)
* ``failed``         trained with score 0 because the reward function raised or timed out
* ``dropped_stale``  dropped by the trainer as too stale
* ``dropped_error``  dropped for a rollout error (no usable response)
* ``in_flight``      ``fed - trained - dropped_stale - dropped_error``: still in the mesh

Rollout and reward counters restart at 0 with their process; :class:`Meter` adds each
incarnation's totals. The trainer's counters are restored from its checkpoint on restart:
steps after the checkpoint are trained again, so they are taken as they are.

:func:`audit` checks the same from the queue's per-sample ledger at the end: every fed
sample id's last stage, how many trained ids there are against the trainer's count
(``trained_twice``), and how many fed samples left no trace at all (``lost``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

LEDGER_FILE = "ledger.json"
STAGES = ("fed", "generated", "regenerated", "scored", "trained", "failed", "dropped_stale", "dropped_error", "in_flight")


class Meter:
    """Sums of counters of processes that restart (a counter going down = a new process)."""

    def __init__(self, base: Mapping[str, float] | None = None) -> None:
        self.base = dict(base or {})  # totals of earlier incarnations and earlier runs
        self._last: dict[tuple[str, str], float] = {}

    def update(self, source: str, values: Mapping[str, float]) -> None:
        for name, v in values.items():
            key = (source, name)
            last = self._last.get(key, 0.0)
            if v < last:  # the source restarted: keep what its previous incarnation counted
                self.base[name] = self.base.get(name, 0.0) + last
            self._last[key] = v

    def total(self, name: str) -> float:
        return self.base.get(name, 0.0) + sum(v for (_, n), v in self._last.items() if n == name)

    def totals(self) -> dict[str, float]:
        names = set(self.base) | {n for _, n in self._last}
        return {n: self.total(n) for n in names}


class Ledger:
    """Live ledger counts from the services' scrapes (see module doc)."""

    def __init__(self, run_dir: Path, n: int) -> None:
        self.path = Path(run_dir) / LEDGER_FILE
        self.n = n
        saved = {}
        if self.path.exists():
            try:
                saved = json.loads(self.path.read_text()).get("events", {})
            except (OSError, ValueError):
                saved = {}
        self.events = Meter(saved)
        self.trainer: dict[str, float] = {}
        self.prompts_fed = 0
        self.audited: dict[str, Any] | None = None

    def observe(self, source: str, scrape: Mapping[str, float], incarnation: int = 0) -> None:
        """One service's /metrics (summed per name); {} (unreachable) is ignored.
        ``incarnation`` (its restart count) keeps each process's counters apart: a restarted
        process may count past its predecessor's last value before its first scrape."""
        if not scrape:
            return
        if source == "trainer":
            self.trainer = {k: scrape.get(k, 0.0) for k in (
                "meshrl_trainer_samples_total", "meshrl_trainer_failed_score_samples_total",
                "meshrl_trainer_dropped_stale_samples_total", "meshrl_trainer_dropped_error_samples_total")}
        elif source.startswith("rollout"):
            self.events.update(f"{source}#{incarnation}", {
                "generated": scrape.get("meshrl_rollout_samples_total", 0.0),
                "regenerated": scrape.get("meshrl_rollout_regenerated_samples_total", 0.0),
                "tokens": scrape.get("meshrl_rollout_tokens_total", 0.0)})
        elif source.startswith("reward"):
            self.events.update(f"{source}#{incarnation}", {"scored": scrape.get("meshrl_reward_samples_total", 0.0)})

    def read_checkpoint(self, ckpt_dir: Path) -> bool:
        """Take the trainer's counters from its newest checkpoint (exact at the end of a
        job: the last scrape may predate the final step)."""
        try:
            step = int((Path(ckpt_dir) / "latest_checkpointed_iteration.txt").read_text().strip())
            meta = json.loads((Path(ckpt_dir) / f"global_step_{step}" / "state.json").read_text())
            c = meta["extra"]["intake"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        seen = self.trainer
        # drops are final when they happen (acked as dropped): the last scrape may know more
        self.trainer = {
            "meshrl_trainer_samples_total": float(c.get("samples_trained", 0) + c.get("samples_nonfinite", 0)),
            "meshrl_trainer_failed_score_samples_total": float(c.get("scored_failed", 0)),
            "meshrl_trainer_dropped_stale_samples_total": max(
                float(c.get("dropped_stale", 0)), seen.get("meshrl_trainer_dropped_stale_samples_total", 0.0)),
            "meshrl_trainer_dropped_error_samples_total": max(
                float(c.get("dropped_error", 0)), seen.get("meshrl_trainer_dropped_error_samples_total", 0.0)),
        }
        return True

    def counts(self) -> dict[str, int]:
        t = self.trainer
        trained = int(t.get("meshrl_trainer_samples_total", 0))
        stale = int(t.get("meshrl_trainer_dropped_stale_samples_total", 0))
        err = int(t.get("meshrl_trainer_dropped_error_samples_total", 0))
        fed = self.prompts_fed * self.n
        return {
            "fed": fed,
            "generated": int(self.events.total("generated")),
            "regenerated": int(self.events.total("regenerated")),
            "scored": int(self.events.total("scored")),
            "trained": trained,
            "failed": int(t.get("meshrl_trainer_failed_score_samples_total", 0)),
            "dropped_stale": stale,
            "dropped_error": err,
            "in_flight": max(0, fed - trained - stale - err),
        }

    def tokens(self) -> float:
        return self.events.total("tokens")

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"events": self.events.totals(), "counts": self.counts(), "audit": self.audited}))
        tmp.replace(self.path)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counts())
        if self.audited is not None:
            out["audit"] = self.audited
        return out


async def audit(queue: Any, prompt_uids: Iterable[str], n: int, trained_count: int,
                batch: int = 5000, timeout: float = 30.0) -> dict[str, Any]:
    """Per-sample check from the queue's ledger (``queue.stages``): the last stage of every
    fed sample ``<uid>/<k>`` (a prompt none of whose samples has a stage yet counts as
    ``queued`` when the prompt itself was queued, else as ``lost``); ``trained_twice`` is
    how many more samples the trainer counted than distinct sample ids reached ``trained``."""
    import asyncio

    uids = list(prompt_uids)
    by_stage: dict[str, int] = {}
    for i in range(0, len(uids), max(1, batch // max(1, n))):
        chunk = uids[i : i + max(1, batch // max(1, n))]
        ids = [f"{u}/{k}" for u in chunk for k in range(n)]
        got = await asyncio.wait_for(queue.stages(ids + chunk), timeout)
        for u in chunk:
            stages = [got.get(f"{u}/{k}") for k in range(n)]
            if not any(stages):
                key = "queued" if got.get(u) else "lost"
                by_stage[key] = by_stage.get(key, 0) + n
                continue
            for s in stages:
                key = s or "lost"
                by_stage[key] = by_stage.get(key, 0) + 1
    trained = by_stage.get("trained", 0) + by_stage.get("nonfinite", 0)
    return {"stages": by_stage, "lost": by_stage.get("lost", 0),
            "trained_twice": max(0, trained_count - trained), "trained_ids": trained}
