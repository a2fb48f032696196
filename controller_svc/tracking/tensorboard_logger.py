"""``tensorboard``: scalar summaries in TensorBoard event files (``torch.utils.tensorboard``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from controller_svc.tracking.base import MetricsLogger


class TensorBoardLogger(MetricsLogger):
    """Writes under ``$TENSORBOARD_DIR`` if set (verl's variable), else ``<run_dir>/tensorboard``."""

    name = "tensorboard"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        import tensorboard  # noqa: F401 - torch's writer needs it; fail here with the package name
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(os.environ.get("TENSORBOARD_DIR") or self.run_dir / "tensorboard")
        self._w = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self._w.add_scalar(k, v, global_step=step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()
