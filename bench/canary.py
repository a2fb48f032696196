"""Benchmark: the same job with every version pushed to all replicas, and through the canary gate.

Both modes run the whole mesh (``meshrl run``: embedded broker, two vLLM replicas, one reward
worker, one FSDP2 trainer rank) on the same warm-started tiny model, data, seed and number of
steps; only ``weights.rollout.mode`` differs:

- ``all``: every published version goes to both replicas at once;
- ``canary``: one replica is the canary; a version is promoted to the other once the
  trainer judged the canary's samples of it. The publisher's test-only fault
  (``MESHRL_TEST_WEIGHTS_FAULT``) negates ``model.norm.weight`` of the ``--bad-candidate``-th
  candidate (valid tensors, wrong policy), with ``on_reject: continue``, so the run also
  shows how fast a bad version is caught -- and that the other replica never serves it.

    python bench/canary.py [--steps 48 --batch 8 --n 4 --staleness 3 --bad-candidate 3]
    python bench/canary.py --job quickstart [--steps 40]

Two jobs. ``--job toy`` (the default) is small on purpose: 8 prompts x 4 samples per step,
the trainer steps every ~0.15 s, shorter than the mesh's sample latency, which is the worst
case for a gate that judges a version on its samples. It runs 48 steps: at 16 (the default
until 2026-11-28) training took 2 s, a third of it on the backlog queued before the first
step, so one 0.3 s promotion wait or the bad candidate's dropped samples moved the ratio by
a tenth (0.80-0.98 over six runs); 48 steps cost ~5 s more per mode. ``--job quickstart`` is the quick
start's own job (``examples/quickstart.yaml`` as it is: 32 prompts x 16 samples per step,
``max_staleness: 1``, its actor settings) on two replicas instead of one; ``--batch``,
``--n``, ``--response`` and ``--staleness`` then default to the spec's values.

Canary mode sizes itself (docs/weights.md, "How the canary sizes itself"): the job's views
give the trainer a staleness budget with two versions for the gate (the promoted replica
serves a version that trails the trainer by the promotion delay), hold the admission window
at what ``--staleness`` gives, and judge a candidate on four groups. So at its defaults the
canary run already has the settings once given by hand (``--job quickstart``: a budget of 4,
``async.max_in_flight=64``, ``promote_after_samples=64``); the sizes it ran with are printed
after it (``sized:``, from the trainer's view). The flags still work and win where given:
``--promote-after N``, ``--set async.max_in_flight=N``, ``--set weights.rollout.staleness_budget=N``
(``--staleness`` is the user's ``async.max_staleness`` in both modes: canary mode adds its
share to it).

Throughput is trained samples per second from the end of the first step (start-up counts in
neither mode). ``promote_delay_s`` is the median time from a candidate's publication to its
promotion; ``detect_steps`` the trainer steps from the bad version's publication (its
version number is the step that made it) to the step that rejected it. Last line:
``canary throughput_ratio=<canary/all> promote_delay_s=<median> detect_steps=<steps>
bad_version_on_promoted_replica=<yes|no>``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from async_vs_sync import prepare  # the same tiny model, task and warm start

ROOT = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=("toy", "quickstart"), default="toy",
                   help="toy: a tiny batch and ~0.15 s steps; quickstart: examples/quickstart.yaml as it is")
    p.add_argument("--steps", type=int, default=None, help="training steps per mode (toy: 48, quickstart: 40)")
    p.add_argument("--batch", type=int, default=None, help="prompts per step (data.train_batch_size; toy: 8)")
    p.add_argument("--n", type=int, default=None, help="samples per prompt (rollout.n; toy: 4)")
    p.add_argument("--response", type=int, default=None, help="data.max_response_length in tokens (toy: 16)")
    p.add_argument("--terms", type=int, default=2, help="operands per arith prompt")
    p.add_argument("--staleness", type=int, default=None, help="async.max_staleness of both modes (toy: 3)")
    p.add_argument("--bad-candidate", type=int, default=3, help="which candidate the fault corrupts (0: none)")
    p.add_argument("--promote-after", type=int, default=None,
                   help="weights.rollout.promote_after_samples (default: as the views size it, four groups)")
    p.add_argument("--warm-steps", type=int, default=60, help="supervised warm-start steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a job override for both modes (repeatable), e.g. rollout.on_weight_update=abort_requeue")
    p.add_argument("--modes", default="all,canary", help="comma-separated: all, canary")
    p.add_argument("--workdir", default=None, help="where models, data and runs go (default: a temp dir)")
    args = p.parse_args()
    if args.steps is None and args.job == "quickstart":
        args.steps = 40
    if args.job == "toy":  # the quick start's spec keeps its own values where these stay None
        for key, value in (("steps", 48), ("batch", 8), ("n", 4), ("response", 16), ("staleness", 3)):
            if getattr(args, key) is None:
                setattr(args, key, value)
    return args


def run_mode(mode: str, work: Path, model: Path, train: Path, args: argparse.Namespace) -> dict:
    run_dir = work / f"run-{mode}"
    overrides = [
        f"name=bench-canary-{mode}", f"model.path={model}", f"data.train_files={train}", "data.val_files=[]",
        f"data.seed={args.seed}", f"rollout.seed={args.seed}", f"trainer.total_steps={args.steps}",
        "trainer.save_freq=-1", "trainer.test_freq=-1", "services.rollout.replicas=2",
        f"weights.rollout.mode={mode}", "weights.rollout.on_reject=continue",
    ]
    for key, value in (("data.max_response_length", args.response), ("data.train_batch_size", args.batch),
                       ("rollout.n", args.n), ("async.max_staleness", args.staleness)):
        if value is not None:
            overrides.append(f"{key}={value}")
    if args.job == "toy":  # one optimizer step per batch, one micro-batch
        overrides += [f"actor.ppo_mini_batch_size={args.batch}", f"actor.ppo_micro_batch_size_per_gpu={args.batch * args.n}"]
    if args.promote_after:
        overrides.append(f"weights.rollout.promote_after_samples={args.promote_after}")
    overrides += args.set
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if mode == "canary" and args.bad_candidate:
        env["MESHRL_TEST_WEIGHTS_FAULT"] = f"candidate={args.bad_candidate}:negate:model.norm.weight"
    cmd = [sys.executable, "-m", "meshrl_cli", "run", str(ROOT / "examples" / "quickstart.yaml"), *overrides,
           "--run-dir", str(run_dir), "--no-progress"]
    with open(work / f"{mode}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=7200)
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: meshrl run exited {proc.returncode}\n{(work / f'{mode}.log').read_text()[-3000:]}")
    hist = json.loads((run_dir / "summary.json").read_text())["history"]
    lines = [json.loads(x) for x in (run_dir / "trainer_metrics.jsonl").read_text().splitlines() if x.strip()]
    # trained samples per second from the end of the first step (the judging batches of canary
    # mode close early, so steps differ in size: count the samples), timed by the trainer's own
    # step records (the controller's history is sampled every few seconds)
    samples = sum(rec["samples"] for rec in lines[1:])
    train_s = lines[-1]["time"] - lines[0]["time"]
    out = {"mode": mode, "samples": samples, "train_s": train_s, "samples_per_s": samples / max(train_s, 1e-9),
           "final_reward": statistics.fmean(h["reward_mean"] for h in hist[-5:]),
           "staleness_mean": statistics.fmean(h["staleness"] for h in hist)}
    if mode == "canary":
        out.update(gate_figures(run_dir, lines, args.bad_candidate))
        out["sized"] = sized_settings(run_dir)
    return out


def sized_settings(run_dir: Path) -> dict:
    """What the canary run's trainer ran with, as the job's views sized it (its view file)."""
    import yaml

    view = yaml.safe_load((run_dir / "config" / "trainer.yaml").read_text())
    return {"max_staleness": view["async"]["max_staleness"], "max_in_flight": view["async"]["max_in_flight"],
            "promote_after_samples": view["weights"]["rollout"]["promote_after_samples"]}


def gate_figures(run_dir: Path, lines: list[dict], bad_candidate: int) -> dict:
    """Promotion delays, detection steps, and whether the promoted replica served the bad version."""
    weights = json.loads((run_dir / "status.json").read_text())["weights"]
    events = weights.get("events", [])
    published = {e["version"]: e["ts"] for e in events if e["kind"] == "candidate"}
    delays = [e["ts"] - published[e["version"]] for e in events if e["kind"] == "promoted" and e["version"] in published]
    # the version the test fault corrupted, as the publisher logged it (status.json keeps only
    # the last 64 gate events: in a long run the first candidates are gone from it)
    corrupted = re.search(r"MESHRL_TEST_WEIGHTS_FAULT: corrupting \S+ of v(\d+)",
                          (run_dir / "logs" / "trainer.log").read_text()) if bad_candidate else None
    bad = int(corrupted.group(1)) if corrupted else None
    rejected_at = None if bad is None else next(
        (rec["step"] for rec in lines if rec.get("canary", {}).get("version") == bad and not rec["canary"]["promoted"]),
        None)
    served_bad = False
    for name, r in weights["replicas"].items():
        if r["role"] == "promoted":
            log = (run_dir / "logs" / f"{name}.log").read_text()
            served_bad |= bad is not None and bool(re.search(rf"serves (policy version {bad}\b|v{bad} \()", log))
    return {"promote_delays_s": delays, "promotions": len(delays), "bad_version": bad,
            "rejected_at_step": rejected_at, "detect_steps": None if rejected_at is None or bad is None
            else rejected_at - bad, "bad_version_on_promoted_replica": served_bad,
            "rejections": {k: v for k, v in weights.get("rejected", {}).items()}}


def main() -> int:
    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="meshrl-canary-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    model, train = prepare(work, args.seed, args.warm_steps, args.terms)
    results = {}
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        t0 = time.monotonic()
        r = results[mode] = run_mode(mode, work, model, train, args)
        print(f"{mode:6s} samples_per_s={r['samples_per_s']:.1f} samples={r['samples']} train_s={r['train_s']:.1f} "
              f"wall_s={time.monotonic() - t0:.0f} final_reward={r['final_reward']:.3f} "
              f"staleness_mean={r['staleness_mean']:.2f} load={Path('/proc/loadavg').read_text().split()[:3]}",
              flush=True)
        if mode == "canary":
            print(f"       promotions={r['promotions']} delays_s={[round(d, 1) for d in r['promote_delays_s']]} "
                  f"bad_version={'none' if r['bad_version'] is None else 'v' + str(r['bad_version'])} rejected_at_step={r['rejected_at_step']} "
                  f"rejections={r['rejections']}", flush=True)
            print(f"       sized: trainer max_staleness={r['sized']['max_staleness']} "
                  f"max_in_flight={r['sized']['max_in_flight']} "
                  f"promote_after_samples={r['sized']['promote_after_samples']}", flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    if "all" not in results or "canary" not in results:
        print(f"results in {work / 'results.json'} (need both modes for the ratio line)")
        return 0
    c = results["canary"]
    ratio = c["samples_per_s"] / results["all"]["samples_per_s"]
    delay = statistics.median(c["promote_delays_s"]) if c["promote_delays_s"] else float("nan")
    print(f"load average at end: {Path('/proc/loadavg').read_text().strip()}")
    print(f"canary throughput_ratio={ratio:.3f} promote_delay_s={delay:.1f} detect_steps={c['detect_steps']} "
          f"bad_version_on_promoted_replica={'yes' if c['bad_version_on_promoted_replica'] else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
