"""Benchmark: the same job trained synchronously and asynchronously, same run, same machine.

Each mode runs the whole mesh (``meshrl run``: embedded broker, one vLLM replica, one reward
worker, one FSDP2 trainer rank) on the same model, data, seed and number of prompts:

- ``sync``: ``async.mode=sync`` — a batch is generated only once every replica serves the
  trainer's current version, then scored, trained, and the new weights pushed (verl's loop,
  on the same processes);
- ``async-s1`` / ``async-s2``: ``async.mode=async`` with ``max_staleness`` 1 and 2 and
  truncated importance sampling on the rollout log-probs;
- ``...-split``: the same with the trainer pinned to the first CPU (one thread) and the
  replica to the rest (``services.trainer.cpus``, ``services.rollout.cpus``), so that
  overlapping services do not fight over the same cores.

While a job runs, the process tree of each service (its vLLM engine-core child included) is
sampled from ``/proc`` (psutil) to add up CPU seconds per service: ``busy`` is that divided
by the job's wall time (1.0 = one core for the whole run). The machine's cores bound the
overlap: async can hide generation only while the trainer has a core of its own.

    python bench/async_vs_sync.py [--steps 24 --batch 32 --n 8 --response 24 --target 0.6]

Last line:
``async_vs_sync throughput_ratio=<R> time_to_target_ratio=<T> final_reward_async=<A> final_reward_sync=<S>``
with R = async/sync trained samples per second, T = async/sync minutes to the target
training reward (moving mean over 5 steps), A/S the mean reward of the last 5 steps.
The async figures are those of the faster of ``async-s<K>`` and ``async-s<K>-split`` with
K = ``--async-staleness`` (default 1), or of ``--report MODE``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _proctree import TreeSampler

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24, help="training steps per mode")
    p.add_argument("--batch", type=int, default=32, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    p.add_argument("--response", type=int, default=24, help="data.max_response_length (tokens)")
    p.add_argument("--terms", type=int, default=3, help="operands per arith prompt; the worked solution of "
                   "3 terms ('3+1=4,4+2=6') is ~12 tokens, so generation is a real share of a step")
    p.add_argument("--mini-batches", type=int, default=2, help="PPO updates per step")
    p.add_argument("--target", type=float, default=0.6, help="training reward that counts as reached")
    p.add_argument("--warm-steps", type=int, default=90, help="supervised warm-start steps (90: the format is learnt, the sums are not)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="sync,async-s1,async-s2,async-s1-split,async-s2-split",
                   help="comma-separated: sync, async-s<K>; a '-split' suffix pins the trainer to the first CPU "
                   "(one thread) and the replica to the others (services.*.cpus)")
    p.add_argument("--async-staleness", type=int, default=1, help="which async run the last line reports")
    p.add_argument("--report", default=None, help="the async mode the last line reports (default: the fastest "
                   "async-s<K>[-split] with K = --async-staleness)")
    p.add_argument("--workdir", default=None, help="where models, data and runs go (default: a temp dir)")
    return p.parse_args()


def prepare(work: Path, seed: int, warm_steps: int, terms: int) -> tuple[Path, Path]:
    """Tiny model, the chained-addition task, and a short supervised warm start on its format."""
    from services.data import synthetic
    from services.data.parquet import write_rows
    from services.modelling.tiny import TinyModelSpec, build_tiny_model
    from trainer_svc.warmstart import warm_start

    model, warm, data = work / "model", work / "model-warm", work / "data"
    if not (warm / "config.json").exists():
        build_tiny_model(model, TinyModelSpec(seed=seed))
        write_rows(synthetic.arith_rows(2000, seed=seed, max_operand=4, ops="+", terms=terms), data / "train.parquet")
        warm_start(model, data / "train.parquet", warm, steps=warm_steps, seed=seed, log_every=0)
    return warm, data / "train.parquet"


def run_mode(mode: str, work: Path, model: Path, train: Path, args: argparse.Namespace) -> dict:
    run_dir = work / f"run-{mode}"
    base, split = mode.removesuffix("-split"), mode.endswith("-split")
    if base == "sync":
        mode_overrides = ["async.mode=sync", "async.max_staleness=0", "algorithm.off_policy.mode=none"]
    else:
        k = int(base.removeprefix("async-s"))
        mode_overrides = ["async.mode=async", f"async.max_staleness={k}", "algorithm.off_policy.mode=tis"]
    if split:  # the trainer on the first CPU (one thread), the replica on the others
        cpus = sorted(os.sched_getaffinity(0))
        rest = ",".join(map(str, cpus[1:])) or str(cpus[0])
        mode_overrides += [f"services.trainer.cpus={cpus[0]}", "services.trainer.torch_threads=1",
                           f"services.rollout.cpus={rest}"]
    overrides = [
        f"name=bench-{mode}", f"model.path={model}", f"data.train_files={train}", "data.val_files=[]",
        f"data.max_response_length={args.response}", f"data.train_batch_size={args.batch}",
        f"data.seed={args.seed}", f"rollout.n={args.n}", f"rollout.seed={args.seed}",
        f"actor.ppo_mini_batch_size={args.batch // args.mini_batches}",
        f"actor.ppo_micro_batch_size_per_gpu={args.batch * args.n // args.mini_batches}",
        f"trainer.total_steps={args.steps}", *mode_overrides,
    ]
    cmd = [sys.executable, "-m", "meshrl_cli", "run", str(ROOT / "examples" / "quickstart.yaml"), *overrides,
           "--run-dir", str(run_dir), "--no-progress"]
    log = open(work / f"{mode}.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    sampler = TreeSampler(proc.pid)
    while proc.poll() is None:
        sampler.sample()
        time.sleep(0.5)
    wall = time.monotonic() - t0
    log.close()
    if proc.returncode != 0:
        tail = (work / f"{mode}.log").read_text()[-3000:]
        raise SystemExit(f"{mode}: meshrl run exited {proc.returncode}\n{tail}")
    summary = json.loads((run_dir / "summary.json").read_text())
    hist = summary["history"]
    # Throughput and time-to-target are clocked from the end of the first step, so the
    # services' start-up (vLLM's engine init above all) counts in neither mode.
    t_first = hist[0]["t"] if hist else 0.0
    t_last = hist[-1]["t"] if hist else wall
    samples = (len(hist) - 1) * args.batch * args.n
    rewards = [h["reward_mean"] for h in hist]
    reach = None
    for i in range(len(rewards)):
        window = rewards[max(0, i - 4): i + 1]
        if len(window) == 5 and sum(window) / 5 >= args.target:
            reach = hist[i]["t"] - t_first
            break
    busy = {k: round(v / max(wall, 1e-9), 2) for k, v in sorted(sampler.totals().items())}
    return {
        "mode": mode, "wall_s": wall, "train_s": t_last - t_first, "first_step_s": t_first,
        "samples_per_s": samples / max(t_last - t_first, 1e-9), "minutes_to_target": None if reach is None else reach / 60,
        "final_reward": sum(rewards[-5:]) / max(1, len(rewards[-5:])), "busy": busy,
        "staleness_mean": sum(h["staleness"] for h in hist) / max(1, len(hist)),
    }


def main() -> int:
    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="meshrl-async-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, train = prepare(work, args.seed, args.warm_steps, args.terms)
    results = {}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        r = run_mode(mode, work, model, train, args)
        results[mode] = r
        mtt = "n/a" if r["minutes_to_target"] is None else f"{r['minutes_to_target']:.2f}"
        print(f"{mode:9s} samples_per_s={r['samples_per_s']:.1f} train_s={r['train_s']:.1f} "
              f"wall_s={r['wall_s']:.1f} minutes_to_target={mtt} final_reward={r['final_reward']:.3f} "
              f"staleness_mean={r['staleness_mean']:.2f} busy_cores={r['busy']}", flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    sync = results.get("sync")
    candidates = [args.report] if args.report else [f"async-s{args.async_staleness}", f"async-s{args.async_staleness}-split"]
    ran = [results[m] for m in candidates if m in results]
    asyn = max(ran, key=lambda r: r["samples_per_s"]) if ran else None
    key = asyn["mode"] if asyn else candidates[0]
    if sync is None or asyn is None:
        print(f"results in {work / 'results.json'} (need sync and {key} for the ratio line)")
        return 0
    r = asyn["samples_per_s"] / sync["samples_per_s"]
    if sync["minutes_to_target"] and asyn["minutes_to_target"]:
        t = asyn["minutes_to_target"] / sync["minutes_to_target"]
    else:
        t = math.nan
    print(f"reporting {key} against sync", flush=True)
    print(f"async_vs_sync throughput_ratio={r:.3f} time_to_target_ratio={t:.3f} "
          f"final_reward_async={asyn['final_reward']:.3f} final_reward_sync={sync['final_reward']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
