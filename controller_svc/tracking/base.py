"""The logger interface, the registry of backends and the factory."""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("meshrl.tracking")

#: logger name -> (module, class, pip package it needs or "")
LOGGERS: dict[str, tuple[str, str, str]] = {
    "console": ("controller_svc.tracking.console_logger", "ConsoleLogger", ""),
    "jsonl": ("controller_svc.tracking.jsonl_logger", "JsonlLogger", ""),
    "tensorboard": ("controller_svc.tracking.tensorboard_logger", "TensorBoardLogger", "tensorboard"),
    "wandb": ("controller_svc.tracking.wandb_logger", "WandbLogger", "wandb"),
    "mlflow": ("controller_svc.tracking.mlflow_logger", "MlflowLogger", "mlflow-skinny"),
}


class MetricsLogger:
    """One backend. ``log`` gets flat ``{"a/b": float}`` dicts; ``close`` flushes and ends the run."""

    name = ""

    def __init__(self, *, run_dir: Path, project: str, experiment: str, config: Mapping[str, Any]) -> None:
        self.run_dir, self.project, self.experiment, self.config = run_dir, project, experiment, config

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Flush and end the run (idempotent)."""


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite-or-not numeric entries of ``metrics`` as floats (bools, ints included;
    strings, lists and None left out)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or isinstance(v, (int, float)):
            out[str(k)] = float(v)
        elif hasattr(v, "item") and getattr(v, "ndim", 1) == 0:  # numpy / torch scalars
            out[str(k)] = float(v.item())
    return out


class MultiLogger:
    """Fans ``log``/``close`` out to every backend. A backend that fails while logging is
    reported once and dropped, so tracking never stops training."""

    def __init__(self, loggers: list[MetricsLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        flat = scalars(metrics)
        if not flat:
            return
        for lg in list(self.loggers):
            try:
                lg.log(flat, step)
            except Exception as exc:  # noqa: BLE001 - a tracking backend must not stop the job
                log.error("logger %s failed at step %d and is turned off: %s", lg.name, step, exc)
                self.loggers.remove(lg)
                try:
                    lg.close()
                except Exception:  # noqa: BLE001
                    pass

    def close(self) -> None:
        for lg in self.loggers:
            try:
                lg.close()
            except Exception as exc:  # noqa: BLE001
                log.error("logger %s failed to close: %s", lg.name, exc)
        self.loggers = []


def check_names(names: Iterable[str]) -> list[str]:
    """Problems with a ``trainer.logger`` list: unknown names (with the known ones)."""
    return [f"unknown logger {n!r}; known: {', '.join(LOGGERS)}" for n in names if n not in LOGGERS]


def make_loggers(names: Iterable[str], *, run_dir: str | Path, project: str = "meshrl", experiment: str = "",
                 config: Mapping[str, Any] | None = None) -> MultiLogger:
    """The backends ``names`` (in order, duplicates once) for a run in ``run_dir``."""
    names = list(dict.fromkeys(names))
    problems = check_names(names)
    if problems:
        raise ValueError("trainer.logger: " + "; ".join(problems))
    run_dir = Path(run_dir)
    made: list[MetricsLogger] = []
    try:
        for n in names:
            module, cls, package = LOGGERS[n]
            try:
                mod = importlib.import_module(module)
            except ImportError as exc:
                raise ValueError(f"trainer.logger: {n!r} needs the {package!r} package ({exc}); "
                                 f"install it with `pip install {package}` or `pip install meshrl[loggers]`") from None
            made.append(getattr(mod, cls)(run_dir=run_dir, project=project, experiment=experiment or run_dir.name,
                                          config=dict(config or {})))
    except BaseException:
        MultiLogger(made).close()
        raise
    return MultiLogger(made)


def is_finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))
