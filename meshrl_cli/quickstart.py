"""``meshrl quickstart``: the whole quick start on this machine, nothing downloaded.

1. build the tiny Qwen2-style model with a locally trained tokenizer;
2. write the built-in single-digit addition task in verl's parquet format;
3. warm-start the model with a few supervised steps (it learns the answer *format*; its
   expected reward stays low, see :mod:`trainer_svc.warmstart`);
4. run ``examples/quickstart.yaml`` (GRPO) with ``meshrl run`` — RL does the rest;
5. print ``quickstart reward_start=<A> reward_end=<B> steps=<N> minutes=<M>``.

Everything goes under ``--out`` (default ``runs/quickstart``).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/quickstart", help="where model, data and the run go")
    p.add_argument("--spec", default=None, help="job spec (default: examples/quickstart.yaml of this checkout)")
    p.add_argument("--warm-steps", type=int, default=50, help="supervised warm-start steps (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's initial weights, the warm start, the "
                   "prompt order and sampling (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="a.b=c overrides for the job spec")


def prepare(out, seed: int = 0, warm_steps: int = 50, log=print):
    """Steps 1-3 under ``out``: the tiny model (kept if built), the addition task's parquet
    files and the warm start. Returns ``(warm model dir, data dir, WarmStartResult)``; the
    benchmarks that compare against the quick start start from the same three."""
    from services.data import synthetic
    from services.data.parquet import write_rows
    from services.modelling.tiny import TinyModelSpec, build_tiny_model
    from trainer_svc.warmstart import warm_start

    model, warm, data = out / "model", out / "model-warm", out / "data"
    if not (model / "config.json").exists():
        build_tiny_model(model, TinyModelSpec(seed=seed))
        log(f"[1/4] tiny model built: {model}")
    write_rows(synthetic.arith_rows(2000, seed=0, max_operand=4, ops="+"), data / "train.parquet")
    write_rows(synthetic.arith_rows(100, seed=1, max_operand=4, ops="+", split="test"), data / "test.parquet")
    log(f"[2/4] arithmetic prompts written: {data}")
    res = warm_start(model, data / "train.parquet", warm, steps=warm_steps, seed=seed, log_every=0)
    log(f"[3/4] supervised warm start: {res.steps} steps, loss {res.final_loss:.3f}, "
        f"expected reward {res.p_correct:.3f} (what RL starts from)")
    return warm, data, res


def job_overrides(warm, data, seed: int = 0) -> list[str]:
    """What the quick start sets on top of ``examples/quickstart.yaml``: its files and seed."""
    return [f"model.path={warm}", f"data.train_files={data / 'train.parquet'}",
            f"data.val_files={data / 'test.parquet'}", f"data.seed={seed}", f"rollout.seed={seed}"]


def run(args: argparse.Namespace) -> int:
    import json
    import shutil
    import time
    from pathlib import Path

    from services.config.job import JobSpecError, load_job

    t0 = time.monotonic()
    out = Path(args.out).resolve()
    spec_path = Path(args.spec) if args.spec else Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"
    run_dir = out / "run"
    warm, data, res = prepare(out, args.seed, args.warm_steps, log=lambda line: print(line, flush=True))
    overrides = [*job_overrides(warm, data, args.seed), *args.overrides]
    try:
        spec = load_job(spec_path, overrides)
    except JobSpecError as exc:
        print(f"{spec_path}: {exc}")
        return 2
    if run_dir.exists():
        shutil.rmtree(run_dir)
    print(f"[4/4] GRPO with meshrl run (logs: {run_dir / 'logs'})", flush=True)
    from controller_svc.controller import JobController

    rc = JobController(spec, run_dir, progress=not args.no_progress).run()
    minutes = (time.monotonic() - t0) / 60
    summary_path = run_dir / "summary.json"
    if rc != 0 or not summary_path.exists():
        print(f"quickstart failed (exit {rc}); see {run_dir / 'logs'}")
        return rc or 1
    s = json.loads(summary_path.read_text())
    print(f"plots: {run_dir / 'reward.png'}, {run_dir / 'staleness.png'}, {run_dir / 'throughput.png'}")
    print(f"warm start expected reward {res.p_correct:.3f}; RL: first step {s['reward_start']:.3f}, "
          f"last {min(5, len(s['history']))} steps {s['reward_end']:.3f}")
    if s.get("validation"):
        print(f"validation (held-out prompts, greedy): {s['val_score_start']:.3f} before training -> "
              f"{s['val_score_end']:.3f} at step {s['validation'][-1]['step']} (validation.png)")
    print(f"quickstart reward_start={s['reward_start']:.3f} reward_end={s['reward_end']:.3f} "
          f"steps={s['steps']} minutes={minutes:.1f}")
    return 0
