"""What a job leaves behind: per-step history, ``summary.json`` and PNG plots.

The controller scrapes the trainer's and the replicas' ``/metrics``; :class:`History`
turns successive scrapes into one row per training step (reward mean, loss, mean
staleness of the step's samples, rollout tokens/s).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any



class History:
    """One row per trainer step.

    The trainer appends one JSON line per committed step to ``trainer.metrics_file``
    (step, staleness of the step's samples, its metrics); :meth:`read` picks up new lines,
    so the last step is recorded even when the trainer exits right after it. Rollout
    throughput comes from the replicas' token counters, scraped by the controller.
    """

    def __init__(self, metrics_file: str | Path | None = None) -> None:
        self.metrics_file = Path(metrics_file) if metrics_file else None
        self.steps: list[dict[str, Any]] = []
        self.validation: list[dict[str, Any]] = []  # {"step", "metrics"} per finished validation round
        self.unlogged: list[tuple[int, dict[str, float]]] = []  # (step, full metrics) not yet sent to loggers
        self._offset = 0
        self._last_tokens = 0.0
        self._last_t = 0.0

    def grown(self) -> bool:
        """Whether the metrics file holds bytes not read yet (one stat)."""
        try:
            return self.metrics_file is not None and self.metrics_file.stat().st_size > self._offset
        except OSError:
            return False

    def read(self, rollout_tokens: float, t: float) -> bool:
        """Append rows for new lines of the metrics file; returns whether any were added."""
        if self.metrics_file is None or not self.metrics_file.exists():
            return False
        with open(self.metrics_file) as f:
            f.seek(self._offset)
            chunk = f.read()
        complete, _, _ = chunk.rpartition("\n")
        if not complete:
            return False
        self._offset += len(complete.encode()) + 1
        lines = [json.loads(line) for line in complete.splitlines() if line.strip()]
        dt = max(1e-9, t - self._last_t)
        rate = max(0.0, rollout_tokens - self._last_tokens) / dt
        for rec in lines:
            m = rec.get("metrics") or {}
            lags = rec.get("staleness") or []
            extra = {"staleness/mean": sum(lags) / len(lags) if lags else 0.0, "perf/rollout_tokens_per_s": rate}
            self.unlogged.append((int(rec["step"]), {**m, **extra}))
            hist: dict[str, int] = {}
            for lag in lags:
                hist[str(int(lag))] = hist.get(str(int(lag)), 0) + 1
            self.steps.append(
                {
                    "step": int(rec["step"]),
                    "t": round(t, 2),
                    "reward_mean": float(m.get("critic/score/mean", float("nan"))),
                    "loss": float(m.get("actor/loss", float("nan"))),
                    # KL: the KL loss term when the job uses one, else the PPO KL(old || new) estimate
                    "kl": float(m.get("actor/kl_loss", m.get("actor/ppo_kl", float("nan")))),
                    "entropy": float(m.get("actor/entropy", float("nan"))),
                    "grad_norm": float(m.get("actor/grad_norm", float("nan"))),
                    "logprob_diff": float(m.get("training/rollout_probs_diff_mean", float("nan"))),
                    "val_score": _val_score(m),
                    "staleness": sum(lags) / len(lags) if lags else 0.0,
                    # how many of the step's samples lagged the trainer by each number of versions
                    "staleness_hist": hist,
                    "tokens_per_s": rate,
                    "applied": bool(rec.get("applied", True)),
                }
            )
        self._last_tokens, self._last_t = rollout_tokens, t
        return True


    def add_validation(self, step: int, metrics: dict[str, float]) -> None:
        """Record a finished validation round of ``step``; its mean score also goes into that
        step's row (``val_score``), where the plots and the dashboard read it."""
        self.validation.append({"step": step, "metrics": metrics})
        score = val_score(metrics)
        for row in self.steps:
            if row["step"] == step:
                row["val_score"] = score

    def latest_val_score(self) -> float | None:
        """Mean score of the newest finished validation round (None before the first)."""
        score = val_score(self.validation[-1]["metrics"]) if self.validation else float("nan")
        return None if score != score else score


def val_score(metrics: dict[str, Any]) -> float:
    """Mean over data sources of ``val/test_score/<source>``."""
    vals = [float(v) for k, v in metrics.items() if k.startswith("val/test_score/")]
    return sum(vals) / len(vals) if vals else float("nan")


def _val_score(metrics: dict[str, Any]) -> float:
    """The mean validation score of a step's metrics: the mean over data sources of
    ``val/test_score/<source>`` (or verl's ``val-core/<source>/reward/mean@N``); NaN when the
    step carries none."""
    vals = [float(v) for k, v in metrics.items() if k.startswith("val/test_score/") and isinstance(v, (int, float))]
    if not vals:
        vals = [float(v) for k, v in metrics.items()
                if k.startswith("val-core/") and "/mean@" in k and isinstance(v, (int, float))]  # fmt: skip
    return sum(vals) / len(vals) if vals else float("nan")


def write_report(history: History, run_dir: Path, *, ledger: dict[str, Any] | None = None,
                 restarts: dict[str, int] | None = None) -> dict[str, Any]:
    """``summary.json`` plus ``reward.png``, ``staleness.png``, ``throughput.png`` in ``run_dir``
    (``ledger``: the sample ledger, ``restarts``: restarts per service, both into the summary)."""
    rows = history.steps
    k = min(5, len(rows))
    summary = {
        "steps": rows[-1]["step"] if rows else 0,
        # the first step trains on samples of the starting policy: its reward is where RL starts
        "reward_start": rows[0]["reward_mean"] if rows else None,
        "reward_end": sum(r["reward_mean"] for r in rows[-k:]) / k if rows else None,
        "seconds": rows[-1]["t"] if rows else 0.0,
        "staleness_histogram": staleness_totals(rows),
        "ledger": ledger or {},
        "restarts": restarts or {},
        "validation": history.validation,
        "val_score_start": val_score(history.validation[0]["metrics"]) if history.validation else None,
        "val_score_end": val_score(history.validation[-1]["metrics"]) if history.validation else None,
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
        _plot_staleness(plt, rows, run_dir / "staleness.png")
    if history.validation:
        _plot_validation(history.validation, run_dir / "validation.png")
    return summary


def _plot_validation(rounds: list[dict[str, Any]], path: Path) -> None:
    """``val/test_score/<source>`` (and best@k where reported) per validation round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for r in rounds for k in r["metrics"] if k.startswith("val/test_score/")})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key in keys:
        pts = [(r["step"], r["metrics"][key]) for r in rounds if key in r["metrics"]]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key.removeprefix("val/test_score/"))
    ax.set_xlabel("step")
    ax.set_ylabel("mean score")
    ax.set_title("validation score per data source")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def staleness_totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Samples trained at each staleness (versions behind the trainer), over the whole run."""
    out: dict[str, int] = {}
    for r in rows:
        for lag, count in (r.get("staleness_hist") or {}).items():
            out[lag] = out.get(lag, 0) + int(count)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def _plot_staleness(plt, rows: list[dict[str, Any]], path: Path) -> None:
    """Per step, the share of trained samples at each staleness (stacked), and the mean."""
    steps = [r["step"] for r in rows]
    lags = sorted({int(k) for r in rows for k in (r.get("staleness_hist") or {})})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = [0.0] * len(rows)
    for lag in lags:
        shares = []
        for r in rows:
            h = r.get("staleness_hist") or {}
            total = sum(h.values()) or 1
            shares.append(h.get(str(lag), 0) / total)
        ax.bar(steps, shares, bottom=bottom, width=1.0, label=f"{lag} behind")
        bottom = [b + s for b, s in zip(bottom, shares)]
    ax.set_xlabel("step")
    ax.set_ylabel("share of trained samples")
    ax.set_ylim(0, 1.05)
    ax2 = ax.twinx()
    ax2.plot(steps, [r["staleness"] for r in rows], color="black", marker=".", label="mean")
    ax2.set_ylabel("mean staleness (versions)")
    ax2.set_ylim(bottom=0)
    if lags:
        ax.legend(loc="upper left", fontsize=7, title="versions", title_fontsize=7)
    ax.set_title("staleness of trained samples")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
