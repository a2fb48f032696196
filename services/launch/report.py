"""What a job leaves behind: per-step history, ``summary.json`` and PNG plots.

The controller scrapes the trainer's and the replicas' ``/metrics``; :class:`History`
turns successive scrapes into one row per training step (reward mean, loss, mean
staleness of the step's samples, rollout tokens/s).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.launch.procs import http_get


def scrape(url: str, timeout: float = 2.0) -> dict[str, float]:
    """Sum of every sample of each metric at ``url`` (Prometheus text format); {} if unreachable."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = http_get(url, timeout=timeout)
    if status != 200:
        return {}
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    except ValueError:
        return {}
    return out


class History:
    """One row per trainer step, built from successive scrapes."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self._last_step = 0
        self._last = {"stale_sum": 0.0, "stale_count": 0.0, "tokens": 0.0, "t": 0.0}

    def observe(self, trainer: dict[str, float], rollout_tokens: float, t: float) -> bool:
        """Record a row if the trainer's step counter moved; returns whether it did."""
        step = int(trainer.get("meshrl_trainer_steps_total", 0))
        if step <= self._last_step:
            return False
        s_sum = trainer.get("meshrl_trainer_staleness_versions_sum", 0.0)
        s_cnt = trainer.get("meshrl_trainer_staleness_versions_count", 0.0)
        d_cnt = s_cnt - self._last["stale_count"]
        dt = max(1e-9, t - self._last["t"])
        self.steps.append(
            {
                "step": step,
                "t": round(t, 2),
                "reward_mean": float(trainer.get("meshrl_trainer_reward_mean", float("nan"))),
                "loss": float(trainer.get("meshrl_trainer_loss", float("nan"))),
                "staleness": (s_sum - self._last["stale_sum"]) / d_cnt if d_cnt > 0 else 0.0,
                "tokens_per_s": (rollout_tokens - self._last["tokens"]) / dt,
                "dropped_stale": trainer.get("meshrl_trainer_dropped_stale_samples_total", 0.0),
            }
        )
        self._last_step = step
        self._last = {"stale_sum": s_sum, "stale_count": s_cnt, "tokens": rollout_tokens, "t": t}
        return True


def write_report(history: History, run_dir: Path) -> dict[str, Any]:
    """``summary.json`` plus ``reward.png``, ``staleness.png``, ``throughput.png`` in ``run_dir``."""
    rows = history.steps
    k = max(1, min(5, len(rows) // 4 or 1))
    summary = {
        "steps": rows[-1]["step"] if rows else 0,
        "reward_start": sum(r["reward_mean"] for r in rows[:k]) / k if rows else None,
        "reward_end": sum(r["reward_mean"] for r in rows[-k:]) / k if rows else None,
        "seconds": rows[-1]["t"] if rows else 0.0,
        "history": rows,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if rows:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [r["step"] for r in rows]
        for key, title, fname in (
            ("reward_mean", "mean training reward", "reward.png"),
            ("staleness", "mean staleness of trained samples (versions)", "staleness.png"),
            ("tokens_per_s", "rollout tokens / s", "throughput.png"),
        ):
            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.plot(steps, [r[key] for r in rows], marker=".")
            ax.set_xlabel("step")
            ax.set_title(title)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            fig.savefig(run_dir / fname, dpi=90)
            plt.close(fig)
    return summary
