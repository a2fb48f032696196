"""``wandb``: a Weights & Biases run.

Offline by default (``WANDB_MODE=offline``; files under ``<run_dir>/wandb``, upload later
with ``wandb sync``), so a run never waits on, or fails for lack of, the network. Set
``WANDB_MODE=online`` (and log in) to stream to a server. The job's resolved spec is the
run's config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from controller_svc.tracking.base import MetricsLogger


class WandbLogger(MetricsLogger):
    name = "wandb"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        import wandb

        self.run_dir.mkdir(parents=True, exist_ok=True)
        mode = os.environ.get("WANDB_MODE", "offline")
        self._run = wandb.init(
            project=self.project, name=self.experiment, config=dict(self.config), dir=str(self.run_dir),
            mode=mode, reinit="create_new",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True),
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        if self._run is not None:
            import wandb

            self._run.finish()
            self._run = None
            wandb.teardown()  # waits for the wandb service to write the run file to its end
