"""``console``: one line per step on stdout (through tqdm when a progress bar is shown)."""

from __future__ import annotations

from collections.abc import Mapping

from controller_svc.tracking.base import MetricsLogger

HEADLINE = ("critic/score/mean", "actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
            "actor/grad_norm", "response_length/mean", "staleness/mean")


class ConsoleLogger(MetricsLogger):
    """Prints ``step N: key=value ...`` with the headline training metrics and every
    ``val/`` metric; the full set goes to the other backends."""

    name = "console"

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        keys = [k for k in HEADLINE if k in metrics] + sorted(k for k in metrics if k.startswith("val/"))
        if not keys:
            return
        line = f"step {step}: " + " ".join(f"{k}={metrics[k]:.4g}" for k in keys)
        try:
            from tqdm import tqdm

            tqdm.write(line)
        except ImportError:  # pragma: no cover - tqdm is a dependency
            print(line, flush=True)
