"""Experiment tracking: one interface, one file per backend, a factory (verl's ``trainer.logger``).

    loggers = make_loggers(["console", "jsonl", "tensorboard"], run_dir=run_dir,
                           project="meshrl", experiment="job-1", config=spec_dict)
    loggers.log({"critic/score/mean": 0.4, "val/test_score/meshrl/arith": 0.5}, step=3)
    loggers.close()

| name | backend | writes |
| --- | --- | --- |
| ``console`` | :mod:`.console_logger` | one line per step (headline metrics + every ``val/`` metric) |
| ``jsonl`` | :mod:`.jsonl_logger` | ``<run_dir>/metrics.jsonl``: ``{"step": N, "metrics": {...}}`` per call |
| ``tensorboard`` | :mod:`.tensorboard_logger` | event files under ``<run_dir>/tensorboard`` (``$TENSORBOARD_DIR`` overrides) |
| ``wandb`` | :mod:`.wandb_logger` | a Weights & Biases run; offline (files under ``<run_dir>/wandb``) unless ``WANDB_MODE`` says otherwise |
| ``mlflow`` | :mod:`.mlflow_logger` | an MLflow run in ``$MLFLOW_TRACKING_URI``, default the local store ``<run_dir>/mlruns`` |

Optional backends import their library only when listed (``pip install meshrl[loggers]``);
a listed backend whose library is missing is an error naming the package, at start.
"""

from controller_svc.tracking.base import LOGGERS, MetricsLogger, MultiLogger, make_loggers

__all__ = ["LOGGERS", "MetricsLogger", "MultiLogger", "make_loggers"]
