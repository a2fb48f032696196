"""A real fleet for the fleet tests: started with `meshrl fleet start` in a temporary fleets
directory, stopped with `meshrl fleet stop`; adapter jobs (`meshrl run` of the quick start's
spec with a small batch) attached to it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.fleets import FleetDir

REPO = Path(__file__).resolve().parents[2]


def meshrl(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "meshrl_cli", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


@contextmanager
def running_fleet(root: Path, name: str, model: str, **spec) -> Iterator[tuple[dict, FleetDir, subprocess.Popen]]:
    """Fleet ``name`` of ``model`` (rank 8, tiny lengths; ``spec`` adds or overrides keys),
    ready; stopped with `meshrl fleet stop` on the way out (which must succeed)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MESHRL_FLEETS_DIR=str(root / "fleets"))
    spec_file = root / f"{name}.yaml"
    spec_file.write_text(json.dumps({
        "name": name, "model": {"path": model, "lora_rank": 8},
        "rollout": {"prompt_length": 32, "response_length": 8, "kv_cache_space_gib": 1, "max_num_seqs": 256},
        "replicas": 1, "max_jobs": 2, "restart": {"backoff_s": 0.5}, **spec}))
    out = root / f"{name}.out"
    with open(out, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "meshrl_cli", "fleet", "start", str(spec_file)], cwd=REPO,
                                env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        fdir = FleetDir(name, root / "fleets")
        try:
            deadline = time.monotonic() + 300
            while (fdir.state() or {}).get("state") != "ready":
                assert proc.poll() is None, out.read_text()[-3000:]
                assert time.monotonic() < deadline, out.read_text()[-3000:]
                time.sleep(0.5)
            yield env, fdir, proc
        finally:
            stop = subprocess.run([sys.executable, "-m", "meshrl_cli", "fleet", "stop", name], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=180)
            if proc.poll() is None and stop.returncode != 0:
                proc.kill()
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert proc.wait(60) == 0, out.read_text()[-3000:]
        assert fdir.state()["state"] == "stopped"


def adapter_job(env: dict, run_dir: Path, model: str, data: str, fleet: str, *overrides: str) -> subprocess.Popen:
    """`meshrl run` of a small adapter job (4 prompts x 4 samples per step, 3 steps) on ``fleet``."""
    return meshrl("run", str(REPO / "examples/quickstart.yaml"), "--run-dir", str(run_dir), "--no-progress",
                  f"model.path={model}", f"data.train_files={data}", "data.val_files=[]",
                  "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4", "trainer.total_steps=3",
                  "model.lora_rank=8", "model.lora_alpha=16", f"services.rollout.fleet={fleet}", *overrides, env=env)


def wait_until(pred, what: str, timeout: float, *, alive: subprocess.Popen | None = None, every: float = 0.2):
    """``pred()``'s first truthy value within ``timeout`` seconds (AssertionError naming ``what``);
    fails at once when ``alive`` exited."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"exited while waiting for {what}: {alive.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(every)
