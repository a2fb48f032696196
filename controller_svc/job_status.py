"""What the world sees of a running job: its state, ``status.json``, the controller's
``/metrics`` and ``/status``, and the report at the end.

``status.json`` (in the run dir, replaced atomically) is what the gateway's local launcher
and the dashboard read; the final state always reaches it. At the end ``summary.json`` and
the PNG plots are written beside it (:mod:`controller_svc.report`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from controller_svc.control_metrics import ControlMetrics
from services.ledger import Ledger
from controller_svc.report import History, write_report
from services.supervision import Supervisor

FINAL_STATES = ("succeeded", "failed", "cancelled")


class StatusBoard:
    """The job's state (``state``, ``detail``) and every view of it (see module doc)."""

    def __init__(self, spec: Any, run_dir: Path, history: History, ledger: Ledger, sup: Supervisor, mesh: Any) -> None:
        self.spec, self.run_dir, self.history, self.ledger, self.sup, self.mesh = spec, run_dir, history, ledger, sup, mesh
        self.state = "pending"
        self.detail = ""
        self.queues: dict[str, int] = {}  # stream -> depth, as last read
        self.prompts_fed: int | None = None
        self.in_flight_prompts: int | None = None  # the feeder's count (from the queue's ledger)
        self.metrics_url: str | None = None
        self.weights: dict[str, Any] = {}  # per replica the version it serves and its role; the canary gate
        self.control = ControlMetrics()
        self._t0 = time.monotonic()

    @property
    def stalled(self) -> bool:
        return self.detail.startswith("stalled")

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def start_metrics(self):
        """Serve the controller's ``/metrics`` (and ``/status``) on a free port."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from services.metrics import MetricsServer

        board = self

        class _Collector:
            def collect(self):
                fam = CounterMetricFamily("meshrl_job_ledger_samples",
                                          "samples per job ledger stage, over restarts (docs/supervision.md)",
                                          labels=["stage"])
                for stage, v in board.ledger.counts().items():
                    fam.add_metric([stage], float(v))
                yield fam
                rs = CounterMetricFamily("meshrl_job_service_restarts", "restarts per service", labels=["service"])
                for name, v in board.sup.restarts().items():
                    rs.add_metric([name], float(v))
                yield rs
                st = GaugeMetricFamily("meshrl_job_stalled", "1 while the job makes no progress")
                st.add_metric([], 1.0 if board.stalled else 0.0)
                yield st

        self.control.registry.register(_Collector())
        host = self.spec.services.host
        server = MetricsServer(self.control.registry, host=host, port=0, status=self.status).start()
        self.metrics_url = f"http://{host}:{server.port}/metrics"
        return server

    def status(self) -> dict[str, Any]:
        last = self.history.steps[-1] if self.history.steps else {}
        tps = last.get("tokens_per_s")
        restarts = self.sup.restarts()
        return {
            "state": self.state, "detail": self.detail, "step": last.get("step", 0),
            "total_steps": self.spec.trainer.total_steps, "reward_mean": last.get("reward_mean"),
            "staleness": last.get("staleness"), "tokens_per_s": None if tps is None else max(0.0, tps),
            "prompts_fed": self.prompts_fed, "in_flight_prompts": self.in_flight_prompts,
            "elapsed_s": round(self.elapsed_s, 1),
            "pid": os.getpid(), "queues": self.queues, "metrics_url": self.metrics_url,
            **{k: last.get(k) for k in ("loss", "kl", "entropy", "grad_norm", "logprob_diff")},
            "val_score": self.history.latest_val_score(),  # the newest finished validation round
            "ledger": self.ledger.as_dict(), "restarts": restarts,
            "ledger_stages": self.control.ledger_counts(), "stalled": self.stalled,
            "services": self.mesh.describe(), "launcher": self.spec.services.launcher,
            "weights": self.weights,
        }

    def write(self) -> None:
        """``status.json`` now; with a final state also the ledger, ``summary.json`` and plots."""
        tmp = self.run_dir / "status.json.tmp"
        tmp.write_text(json.dumps(self.status()))
        os.replace(tmp, self.run_dir / "status.json")
        if self.state in FINAL_STATES:
            self.ledger.save()
            write_report(self.history, self.run_dir, ledger=self.ledger.as_dict(), restarts=self.sup.restarts())
