"""Which fed prompts are still in flight, as the queue's sample ledger says.

A prompt is *finished* when every one of its ``rollout.n`` samples (``<uid>/<k>``) has reached
a final stage in the ledger of the queue backend: ``trained`` (recorded by the trainer when
the step commits), ``nonfinite`` (its step was skipped) or ``dropped`` (too stale, or a
rollout error). Everything else fed is in flight: queued, being generated, scored, waiting
for the trainer.

The ledger lives in the broker's append-only file (or Redis), so it is what survives every
restart. The trainer's own counters do not: a trainer restored from its checkpoint has
forgotten the groups it dropped after that checkpoint (acked, gone from the stream), so
counting "finished" from them after a restart leaves prompts that count as in flight for
ever, and admission never opens again. Here the set is rebuilt from the ledger when the
feeder starts (a resumed job, a restarted feeder) and only ever shrinks by what the ledger
says is final, so the count can be too high for a moment, never too low.

The ledger is bounded (``queues.ledger_max_entries`` ids, oldest out first): a prompt none of
whose ids it still holds was fed so long ago that it counts as finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Ledger stages after which a sample is never trained or dropped again.
FINAL_STAGES = frozenset({"trained", "nonfinite", "dropped"})


class InFlight:
    """The uids of the prompts fed and not finished (see module doc)."""

    def __init__(self, queue: Any, n: int, ids_per_call: int = 5000) -> None:
        self.queue, self.n = queue, n
        self._per_call = max(1, ids_per_call // (n + 1))  # prompts per ``stages`` call
        self._uids: dict[str, None] = {}  # insertion-ordered set

    def __len__(self) -> int:
        return len(self._uids)

    def add(self, uids: Iterable[str]) -> None:
        """Prompts just put on the stream."""
        self._uids.update(dict.fromkeys(uids))

    async def rebuild(self, fed: list[str]) -> None:
        """Start from every prompt ever fed (``fed``: their uids), keeping those not finished."""
        self._uids = dict.fromkeys(await self._unfinished(fed))

    async def refresh(self) -> None:
        """Drop the prompts the ledger now says are finished (raises what the queue raised; the
        set is then unchanged, i.e. never smaller than the truth)."""
        if self._uids:
            still = set(await self._unfinished(list(self._uids)))
            self._uids = {u: None for u in self._uids if u in still}

    async def _unfinished(self, uids: list[str]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(uids), self._per_call):
            part = uids[i : i + self._per_call]
            samples = {u: [f"{u}/{k}" for k in range(self.n)] for u in part}
            got = await self.queue.stages([s for ids in samples.values() for s in ids] + part)
            for u in part:
                stages = [got.get(s) for s in samples[u]]
                if all(s in FINAL_STAGES for s in stages):
                    continue
                if not any(stages) and not got.get(u):
                    continue  # forgotten by the bounded ledger: fed long ago
                out.append(u)
        return out
