"""``jsonl``: ``<run_dir>/metrics.jsonl``, one ``{"step": N, "metrics": {...}}`` line per call."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from controller_svc.tracking.base import MetricsLogger


class JsonlLogger(MetricsLogger):
    name = "jsonl"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}  # JSON has no NaN
        self._f.write(json.dumps({"step": step, "metrics": clean}, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
