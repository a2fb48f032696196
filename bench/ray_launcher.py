"""Benchmark: the same short job through the local launcher and through the Ray launcher
(``services.launcher=ray``) on a local multi-node Ray cluster, same run, same machine.

Both runs are the whole mesh (``meshrl run``: embedded broker, one vLLM replica, one reward
worker, one FSDP2 trainer rank) on the same tiny model, data and seed. The local run goes
first, with no Ray on the machine; then a Ray cluster is started here -- a head with no CPUs
and two worker nodes, ``{rollout: 1, reward: 1}`` and ``{trainer: 1}`` -- and the job runs
again with each service in its own actor on the node its spec asks for. The Ray figure so
pays for everything Ray adds: its daemons on the same cores, the placement group, the actors.

Throughput is trained samples per second clocked from the end of the first step to the last
(start-up is not in it); ``start_s`` is the Ray run's seconds from the driver's start to its
first finished step (connecting, placing, starting the services, the first step).

    python bench/ray_launcher.py [--steps 10 --batch 16 --n 8 --response 16]

Last line: ``ray_launcher ratio_vs_local=<trained samples/s on Ray / local> start_s=<s>``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="training steps per run")
    p.add_argument("--batch", type=int, default=16, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    p.add_argument("--response", type=int, default=16, help="data.max_response_length (tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the model, data and runs go (default: a temp dir)")
    return p.parse_args()


def prepare(work: Path, seed: int) -> tuple[Path, Path]:
    from services.data import synthetic
    from services.data.parquet import write_rows
    from services.modelling.tiny import TinyModelSpec, build_tiny_model

    model, data = work / "model", work / "data" / "train.parquet"
    if not (model / "config.json").exists():
        build_tiny_model(model, TinyModelSpec(seed=seed))
        write_rows(synthetic.arith_rows(2000, seed=seed, max_operand=4, ops="+"), data)
    return model, data


def run(name: str, work: Path, model: Path, train: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    run_dir = work / f"run-{name}"
    overrides = [
        f"name=bench-{name}", f"model.path={model}", f"data.train_files={train}", "data.val_files=[]",
        f"data.max_response_length={args.response}", f"data.train_batch_size={args.batch}",
        f"data.seed={args.seed}", f"rollout.n={args.n}", f"rollout.seed={args.seed}",
        f"actor.ppo_mini_batch_size={args.batch}", f"actor.ppo_micro_batch_size_per_gpu={args.batch * args.n}",
        f"trainer.total_steps={args.steps}", "trainer.save_freq=-1", *extra,
    ]
    cmd = [sys.executable, "-m", "services.cli", "run", str(ROOT / "examples" / "quickstart.yaml"), *overrides,
           "--run-dir", str(run_dir), "--no-progress"]
    t0 = time.monotonic()
    with open(work / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: meshrl run exited {proc.returncode}\n{(work / f'{name}.log').read_text()[-3000:]}")
    hist = json.loads((run_dir / "summary.json").read_text())["history"]
    t_first, t_last = hist[0]["t"], hist[-1]["t"]
    samples = (len(hist) - 1) * args.batch * args.n
    return {"name": name, "wall_s": wall, "first_step_s": t_first, "train_s": t_last - t_first,
            "samples_per_s": samples / max(t_last - t_first, 1e-9)}


def main() -> int:
    from tests.fixtures.ray_nodes import RayNodes

    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="meshrl-ray-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, train = prepare(work, args.seed)
    local = run("local", work, model, train, args, [])
    print(f"local  samples_per_s={local['samples_per_s']:.1f} train_s={local['train_s']:.1f} "
          f"first_step_s={local['first_step_s']:.1f} wall_s={local['wall_s']:.1f}", flush=True)
    with RayNodes("bench") as cluster:
        t0 = time.monotonic()
        cluster.start_head()
        cluster.add_worker(2, {"rollout": 1, "reward": 1})
        cluster.add_worker(2, {"trainer": 1})
        print(f"ray cluster up in {time.monotonic() - t0:.1f}s at {cluster.address}", flush=True)
        ray = run("ray", work, model, train, args, [
            "services.launcher=ray", f"services.ray.address={cluster.address}",
            "services.trainer.ray.resources={trainer: 1}", "services.rollout.ray.resources={rollout: 1}",
            "services.reward.ray.resources={reward: 1}"])
    print(f"ray    samples_per_s={ray['samples_per_s']:.1f} train_s={ray['train_s']:.1f} "
          f"first_step_s={ray['first_step_s']:.1f} wall_s={ray['wall_s']:.1f}", flush=True)
    print(f"ray_launcher ratio_vs_local={ray['samples_per_s'] / local['samples_per_s']:.3f} "
          f"start_s={ray['first_step_s']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
