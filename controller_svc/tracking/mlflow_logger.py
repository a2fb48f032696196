"""``mlflow``: an MLflow run (experiment = ``trainer.project_name``, run name = experiment).

Tracking URI from ``$MLFLOW_TRACKING_URI``, default the local file store
``<run_dir>/mlruns`` (browse with ``MLFLOW_ALLOW_FILE_STORE=true mlflow ui
--backend-store-uri <run_dir>/mlruns``; MLflow 3 refuses file stores unless that variable is set).
MLflow allows only ``[A-Za-z0-9_-. /]`` in metric names: other characters become ``_``
(``val/test_score/x/mean@4`` is logged as ``val/test_score/x/mean_at_4``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping

from controller_svc.tracking.base import MetricsLogger

_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


def mlflow_key(key: str) -> str:
    return _BAD.sub("_", key.replace("@", "_at_"))


class MlflowLogger(MetricsLogger):
    name = "mlflow"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        import warnings

        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (self.run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 keeps the file store but refuses it unless asked: a local store needs no server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        with warnings.catch_warnings():  # the file store's deprecation notice: a local store is what we want
            warnings.simplefilter("ignore", FutureWarning)
            self.client = MlflowClient(tracking_uri=uri)
            exp = self.client.get_experiment_by_name(self.project)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.project)
            self.run_id = self.client.create_run(exp_id, run_name=self.experiment).info.run_id
        self.tracking_uri = uri
        params = {k: str(v)[:500] for k, v in _flat(self.config).items()}
        items = list(params.items())
        from mlflow.entities import Param

        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=[Param(k[:250], v) for k, v in items[i:i + 100]])
        self._open = True

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(mlflow_key(k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(self.run_id, metrics=ms[i:i + 1000])

    def close(self) -> None:
        if self._open:
            self.client.set_terminated(self.run_id)
            self._open = False


def _flat(d: Mapping, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out
