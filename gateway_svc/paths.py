"""Check a submitted spec's input paths: absolute, existing, of the right kind.

A job the gateway starts runs in ``RUNS_DIR/<job id>/``, on the gateway's machine (local
launcher) or on a node that sees the same shared storage (ray). A relative path in the
spec would be resolved against that run dir, which nobody means, and a missing file would
only fail the job seconds later, deep in a service. So the gateway refuses both at submit,
naming each field:

    model.path: relative path 'runs/model' (the job runs in its own run dir: give an absolute path)
    data.train_files[0]: /data/train.parquet does not exist

The fields are :data:`gateway_svc.policy.INPUT_FIELDS`. The gateway itself checks them with
its operator's input roots (:func:`gateway_svc.policy.policy_problems`); this function is
that check with the whole filesystem as the root.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway_svc.policy import _input_problems


def path_problems(resolved: dict[str, Any], roots: Sequence[Path] = (Path("/"),)) -> list[str]:
    """Every bad input path of the resolved spec (a dict), as ``field: problem``; [] when all are fine."""
    return _input_problems(resolved, list(roots))


__all__ = ["path_problems"]
