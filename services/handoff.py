"""The files through which a deployment's gateway hands jobs to its service containers.

A deployment (compose, Kubernetes) runs one long-lived ``meshrl worker`` container per
service (worker_svc/worker.py); the gateway's ``deployment`` launcher
(gateway_svc/launchers/deployment.py) never starts a process of a job itself. The two
meet only in these files, on the storage the whole deployment shares (``RUNS_DIR``):

    RUNS_DIR/current-job.json           {"job_id", "run_dir"}: the job the workers run now
    RUN_DIR/spec.yaml                   the submitted spec + the deployment's wiring
    RUN_DIR/config/<service>.yaml       each service's view of it (its whole config: {view})
    RUN_DIR/job.credential              the job's credential (0600) -- unless the deployment
                                        gives every container one from a secret
    RUN_DIR/control.json                {"paused": bool}         (gateway -> workers)
    RUN_DIR/finished.json               {"state", "detail"}      (first writer wins)
    RUN_DIR/workers/<name>.json         {"role", "state", "restarts", "counters", ...} (each worker)
    RUN_DIR/logs/<name>.log             the service's output

JSON files are replaced whole (write, then rename), so a reader sees the old or the new
content, never half of one.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

CURRENT = "current-job.json"
SPEC = "spec.yaml"
VIEWS = "config"  # RUN_DIR/config/<service>.yaml: the services' views of the job
CONTROL = "control.json"
FINISHED = "finished.json"
WORKERS = "workers"

#: Counters a worker reads from its service's /metrics into its report (the job ledger's sources).
LEDGER_COUNTERS = (
    "meshrl_rollout_samples_total", "meshrl_rollout_regenerated_samples_total", "meshrl_rollout_tokens_total",
    "meshrl_reward_samples_total", "meshrl_feeder_prompts_total",
    "meshrl_trainer_samples_total", "meshrl_trainer_failed_score_samples_total",
    "meshrl_trainer_dropped_stale_samples_total", "meshrl_trainer_dropped_error_samples_total",
    "meshrl_trainer_steps_total",
)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` at once (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def finish(run_dir: Path, state: str, detail: str) -> bool:
    """Record how the job ended; only the first caller's word counts (returns whether it was ours)."""
    try:
        fd = os.open(run_dir / FINISHED, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"state": state, "detail": detail[-4000:], "at": time.time()}))
    return True
