"""Benchmark: adapter jobs on a warm fleet against the same job started cold.

The job is the quick start with a LoRA adapter (``--job quickstart``: the tiny model after
its warm start, rank 8; the default) or the real-model LoRA example (``--job real``:
``examples/smollm2_lora.yaml`` on ``runs/smollm2/model``, prepared as examples/smollm2.yaml
says). In one invocation:

1. **cold**: ``meshrl run JOB``, the job starting its own replica as it does today;
2. a fleet of one replica is started (``meshrl fleet start``; not timed) and the same job
   runs **warm**, attached to it (``services.rollout.fleet``), alone;
3. ``--jobs K`` copies of the job (seeds 0..K-1) run at once on the fleet.

Every run is timed from its ``meshrl run``'s launch: its first generated sample (the job's
``meshrl_rollout_samples_total`` above 0, read on the job's replica metrics port at 10 Hz)
and its first trained step (the first line of ``trainer_metrics.jsonl``). Generated tokens
per second are the job's ``meshrl_rollout_tokens_total`` between its first sample and its
last reading; for K jobs, all their tokens over the span from the first first-sample to the
last reading. Each job's ledger (``summary.json``) must be exact; ``lost`` counts samples
lost or trained twice over all runs. Step-0 validation is off (it would time the validation
set, not the start). The last line:

    fleet first_sample_s=<warm s> first_step_ratio=<warm / cold> jobs=<K> tokens_per_s_ratio=<K jobs / one alone> lost=<n>

``--elastic`` measures the fleet's scaling instead (docs/fleet.md, "Scaling"): a fleet of
``scaling.min_replicas`` = 1 .. ``--max-replicas`` replicas; one job runs alone until its
first step, then a second job arrives; both run to the end, then nothing. It times the
second job's arrival to the fleet's decision to add a replica (``up_latency_s``) and to that
replica serving (``up_serving_s``), and the last job's exit to the fleet back at its minimum
(``down_latency_s``); ``flaps`` counts changes less than ``scaling.cooldown_s`` after the one
before; the ledgers must be exact. The last line:

    fleet_scale scale_ups=<n> scale_downs=<n> flaps=<n> lost=<n> trained_twice=<n> up_latency_s=<s> down_latency_s=<s>

``--cancel`` measures one job's recovery when another on the same replica is cancelled: job
a runs alone for ``--phase-s`` seconds, job b joins for as long, then b is cancelled (SIGINT,
as Ctrl-C or the gateway's cancel) and a runs on for as long again, then a is cancelled.
Job a's steps per minute in each phase (the steps its trainer finished in the phase's last
two thirds), and ``recover_s``: from b's cancel to the end of the first 10-second window in
which a's rate is back to 90% of its rate alone. The last line:

    fleet_cancel recover_s=<s> steps_per_min_alone=<x> shared=<x> after=<x> lost=<n>
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEET = "bench"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", choices=["quickstart", "real"], default="quickstart")
    p.add_argument("--jobs", type=int, default=3, help="jobs at once on the fleet (default 3)")
    p.add_argument("--steps", type=int, default=None, help="RL steps per job (default: quickstart 20, real 4)")
    p.add_argument("--workdir", default=None, help="models, data, runs and the fleet (default: a temp dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an extra override of every job")
    p.add_argument("--elastic", action="store_true", help="measure the fleet's scaling (see the module doc)")
    p.add_argument("--cancel", action="store_true", help="measure a job's recovery from another's cancel")
    p.add_argument("--phase-s", type=float, default=45.0, help="--cancel: seconds of each phase")
    p.add_argument("--max-replicas", type=int, default=2, help="--elastic: the fleet's scaling.max_replicas")
    p.add_argument("--scaling", action="append", default=[], metavar="KEY=VALUE",
                   help="--elastic: a scaling key of the fleet (e.g. up_backlog=48)")
    return p.parse_args(argv)


@dataclass
class Run:
    """One ``meshrl run``: times from its launch, its token counter over time."""

    name: str
    run_dir: Path
    launched: float = 0.0
    first_sample: float | None = None
    first_step: float | None = None
    tokens: list[tuple[float, float]] = field(default_factory=list)  # (unix time, meshrl_rollout_tokens_total)
    ledger: dict = field(default_factory=dict)
    returncode: int | None = None
    ended: float | None = None
    proc: subprocess.Popen | None = None

    def first_sample_s(self) -> float:
        return self.first_sample - self.launched if self.first_sample else float("nan")

    def first_step_s(self) -> float:
        return self.first_step - self.launched if self.first_step else float("nan")

    def tokens_per_s(self) -> float:
        pts = [p for p in self.tokens if p[1] > 0]
        return (pts[-1][1] / (pts[-1][0] - self.first_sample)) if pts and self.first_sample and pts[-1][0] > \
            self.first_sample else float("nan")

    def line(self) -> str:
        led = self.ledger.get("audit", {})
        return (f"{self.name:10s} first_sample_s={self.first_sample_s():.1f} first_step_s={self.first_step_s():.1f} "
                f"tokens_per_s={self.tokens_per_s():.0f} lost={led.get('lost', '?')} "
                f"trained_twice={led.get('trained_twice', '?')} load={load()}")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def watch(run: Run, proc: subprocess.Popen) -> None:
    """Poll the job's replica metrics and its step file until the process ends."""
    from services.metrics.scrape import scrape

    url = None
    steps = run.run_dir / "trainer_metrics.jsonl"
    while proc.poll() is None:
        now = time.time()
        if url is None:
            url = _metrics_url(run.run_dir)
        if url is not None:
            m = scrape(url, timeout=0.5)
            if m.get("meshrl_rollout_samples_total", 0) > 0 and run.first_sample is None:
                run.first_sample = now
            if "meshrl_rollout_tokens_total" in m:
                run.tokens.append((now, m["meshrl_rollout_tokens_total"]))
        if run.first_step is None and steps.exists() and steps.stat().st_size:
            run.first_step = json.loads(steps.read_text().splitlines()[0])["time"]
        time.sleep(0.1)
    run.returncode = proc.returncode
    run.ended = time.time()


def _metrics_url(run_dir: Path) -> str | None:
    import yaml

    view = run_dir / "config" / "rollout-0.yaml"
    try:
        res = yaml.safe_load(view.read_text())["resources"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return f"http://{res['host']}:{res['metrics_port']}/metrics"


def launch(run: Run, cmd: list[str], env: dict) -> tuple[threading.Thread, object]:
    """Start one run and the thread watching it; (thread, its log file)."""
    log = open(run.run_dir.parent / f"{run.name}.log", "w")
    run.launched = time.time()
    proc = run.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    thread = threading.Thread(target=watch, args=(run, proc))
    thread.start()
    return thread, log


def finish_runs(runs: list[Run], started: list[tuple[threading.Thread, object]]) -> None:
    """Wait for every run; exit naming a failed one; read each one's ledger."""
    for t, log in started:
        t.join()
        log.close()
    for run in runs:
        if run.returncode != 0:
            log = run.run_dir.parent / f"{run.name}.log"
            raise SystemExit(f"{run.name}: meshrl run exited {run.returncode}; see {log}:\n{log.read_text()[-3000:]}")
        run.ledger = json.loads((run.run_dir / "summary.json").read_text())["ledger"]


def start_runs(runs: list[tuple[Run, list[str]]], env: dict) -> None:
    """Launch every run at once, watch each, wait for all; exit naming a failed one."""
    finish_runs([r for r, _ in runs], [launch(run, cmd, env) for run, cmd in runs])


def job_command(spec: Path, base: list[str], run_dir: Path, seed: int, fleet: bool) -> list[str]:
    return [sys.executable, "-m", "meshrl_cli", "run", str(spec), *base, f"data.seed={seed}", f"rollout.seed={seed}",
            *([f"services.rollout.fleet={FLEET}"] if fleet else []), "--run-dir", str(run_dir), "--no-progress"]


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="meshrl-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MESHRL_FLEETS_DIR=str(work / "fleets"))
    if args.job == "quickstart":
        from meshrl_cli.quickstart import prepare

        steps = args.steps or 20
        model, data, _ = prepare(work / "quickstart", 0, 50, log=lambda line: print(line, flush=True))
        spec = ROOT / "examples" / "quickstart.yaml"
        rank, lengths = 8, (32, 6)
        base = [f"model.path={model}", f"data.train_files={data / 'train.parquet'}", "data.val_files=[]",
                "model.lora_rank=8", "model.lora_alpha=16", "actor.optim.lr=5e-3"]
    else:
        steps = args.steps or 4
        model = ROOT / "runs" / "smollm2" / "model"
        if not (model / "config.json").exists():
            raise SystemExit(f"{model} is missing: prepare it as examples/smollm2.yaml says")
        spec = ROOT / "examples" / "smollm2_lora.yaml"
        rank, lengths = 16, (96, 32)
        base = ["data.val_files=[]", "trainer.save_freq=-1"]
    base += [f"trainer.total_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1", *args.set]

    if args.elastic:
        return elastic(args, spec, base, env, work, fleet_spec(work, model, rank, lengths, args))
    if args.cancel:
        return cancel(args, spec, base, env, work, fleet_spec(work, model, rank, lengths, args))

    print(f"== cold: the job starts its own replica (load {load()})", flush=True)
    cold = Run("cold", work / "cold")
    start_runs([(cold, job_command(spec, base, cold.run_dir, 0, fleet=False))], env)
    print(cold.line(), flush=True)

    with running_fleet(fleet_spec(work, model, rank, lengths, args), work, env):
        print(f"== warm: the same job on the fleet's replica, alone (load {load()})", flush=True)
        warm = Run("warm", work / "warm")
        start_runs([(warm, job_command(spec, base, warm.run_dir, 0, fleet=True))], env)
        print(warm.line(), flush=True)
        print(f"== {args.jobs} jobs at once on the fleet (load {load()})", flush=True)
        many = [Run(f"fleet-{i}", work / f"fleet-{i}") for i in range(args.jobs)]
        start_runs([(r, job_command(spec, base, r.run_dir, i, fleet=True)) for i, r in enumerate(many)], env)
        for r in many:
            print(r.line(), flush=True)

    span_start = min(r.first_sample for r in many if r.first_sample)
    span_end = max(r.tokens[-1][0] for r in many if r.tokens)
    many_rate = sum(r.tokens[-1][1] for r in many if r.tokens) / (span_end - span_start)
    lost = sum(r.ledger["audit"]["lost"] + r.ledger["audit"]["trained_twice"] for r in (cold, warm, *many))
    print(f"fleet first_sample_s={warm.first_sample_s():.1f} first_step_ratio={warm.first_step_s() / cold.first_step_s():.3f} "
          f"jobs={args.jobs} tokens_per_s_ratio={many_rate / warm.tokens_per_s():.3f} lost={lost}", flush=True)
    return 0


def fleet_spec(work: Path, model: Path, rank: int, lengths: tuple[int, int], args: argparse.Namespace) -> Path:
    """The benchmark's fleet: one replica (``--elastic``: 1 .. ``--max-replicas``)."""
    spec = {"name": FLEET, "model": {"path": str(model), "lora_rank": rank},
            "rollout": {"prompt_length": lengths[0], "response_length": lengths[1], "kv_cache_space_gib": 2,
                        "max_num_seqs": 256},
            "replicas": 1, "max_jobs": max(4, args.jobs)}
    if args.elastic:
        # thresholds from the job's admission window: one generation-bound job alone keeps
        # about a third of it waiting per replica, two jobs most of it (measured, docs/results/fleet.md)
        window = admission_window(args)
        spec["scaling"] = {"min_replicas": 1, "max_replicas": args.max_replicas, "interval_s": 2.0,
                           "up_backlog": round(0.6 * window, 1), "down_backlog": round(0.15 * window, 1),
                           "up_after_s": 6.0, "down_after_s": 10.0, "cooldown_s": 15.0,
                           **{k: float(v) for k, v in (kv.split("=", 1) for kv in args.scaling)}}
    path = work / "fleet.yaml"
    path.write_text(json.dumps(spec))
    return path


def admission_window(args: argparse.Namespace) -> int:
    """The job's admission window, ``(async.max_staleness + 1) * data.train_batch_size`` (the
    example's values; the benchmark does not override them)."""
    import yaml

    raw = yaml.safe_load((ROOT / "examples" / ("quickstart.yaml" if args.job == "quickstart"
                                                 else "smollm2_lora.yaml")).read_text())
    return (raw.get("async", {}).get("max_staleness", 1) + 1) * raw["data"]["train_batch_size"]


@contextmanager
def running_fleet(spec: Path, work: Path, env: dict):
    """``meshrl fleet start`` (not timed) until ready; ``meshrl fleet stop`` on the way out."""
    from services.fleets import FleetDir

    fleet_log = open(work / "fleet.log", "w")
    fleet = subprocess.Popen([sys.executable, "-m", "meshrl_cli", "fleet", "start", str(spec)], cwd=ROOT,
                             env=env, stdout=fleet_log, stderr=subprocess.STDOUT)
    try:
        fdir = FleetDir(FLEET, work / "fleets")
        deadline = time.monotonic() + 600
        while (fdir.state() or {}).get("state") != "ready":
            if fleet.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the fleet did not start; see {work / 'fleet.log'}")
            time.sleep(0.5)
        yield fdir
    finally:
        subprocess.run([sys.executable, "-m", "meshrl_cli", "fleet", "stop", FLEET], cwd=ROOT, env=env,
                       capture_output=True, timeout=180)
        fleet.wait(60)
        fleet_log.close()


def elastic(args: argparse.Namespace, spec: Path, base: list[str], env: dict, work: Path, fleet: Path) -> int:
    """``--elastic`` (see the module doc)."""
    scaling = json.loads(fleet.read_text())["scaling"]

    def serving(fdir) -> int:
        return sum(m.get("phase") == "serving" for m in (fdir.state() or {}).get("members", {}).values())

    timeline: list[tuple[float, int, float]] = []  # (unix time, serving, backlog per replica)

    def sample(fdir) -> None:
        sig = ((fdir.state() or {}).get("scaling") or {}).get("signals") or {}
        timeline.append((time.time(), serving(fdir), sig.get("backlog_per_replica", float("nan"))))

    with running_fleet(fleet, work, env) as fdir:
        first, second = Run("job-a", work / "job-a"), Run("job-b", work / "job-b")
        print(f"== elastic: {first.name} alone until its first step (load {load()})", flush=True)
        started = [launch(first, job_command(spec, base, first.run_dir, 0, fleet=True), env)]
        deadline = time.monotonic() + STEP_DEADLINE_S
        while first.first_step is None and first.returncode is None:
            past(deadline, "job-a's first step")
            sample(fdir)
            time.sleep(0.5)
        print(f"== elastic: {second.name} arrives (load {load()})", flush=True)
        started.append(launch(second, job_command(spec, base, second.run_dir, 1, fleet=True), env))
        up_serving = None
        deadline = time.monotonic() + RUN_DEADLINE_S
        while first.returncode is None or second.returncode is None:
            past(deadline, "both jobs' end")
            sample(fdir)
            if up_serving is None and serving(fdir) > 1:
                up_serving = time.time() - second.launched
            time.sleep(0.5)
        finish_runs([first, second], started)
        left = max(first.ended, second.ended)
        deadline = time.monotonic() + 300
        while serving(fdir) > 1 or any(m.get("phase") in ("starting", "draining")
                                       for m in fdir.state().get("members", {}).values()):
            sample(fdir)
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        back = time.time()
        events = fdir.events()
    for r in (first, second):
        print(r.line(), flush=True)
    ups = [e for e in events if e["action"] == "add"]
    downs = [e for e in events if e["action"] == "remove"]
    flaps = sum(b["time"] - a["time"] < scaling["cooldown_s"] for a, b in zip(events, events[1:]))
    after = [e for e in ups if e["time"] >= second.launched]
    up_latency = after[0]["time"] - second.launched if after else float("nan")
    early = [e for e in ups if e["time"] < second.launched]
    for e in events:
        sig = e.get("signals", {})
        print(f"  event +{e['time'] - first.launched:6.1f}s {e['action']:6s} {e['reason']:12s} {e['from']}->{e['to']} "
              f"backlog_per_replica={sig.get('backlog_per_replica')} jobs={sig.get('jobs')}", flush=True)
    print("  timeline (s since job-a, serving, backlog/replica): " + " ".join(
        f"{t - first.launched:.0f}:{n}:{b:.1f}" for t, n, b in timeline[::10]), flush=True)
    lost = sum(r.ledger["audit"]["lost"] for r in (first, second))
    twice = sum(r.ledger["audit"]["trained_twice"] for r in (first, second))
    print(f"  up_serving_s={up_serving if up_serving is None else round(up_serving, 1)} "
          f"scale_ups_before_job_b={len(early)} load={load()}", flush=True)
    print(f"fleet_scale scale_ups={len(ups)} scale_downs={len(downs)} flaps={flaps} lost={lost} trained_twice={twice} "
          f"up_latency_s={up_latency:.1f} down_latency_s={back - left:.1f}", flush=True)
    return 0


STEP_DEADLINE_S = 600.0  # a job's first step (its start included)
RUN_DEADLINE_S = 3600.0  # the elastic runs' jobs to their end


def past(deadline: float, what: str) -> None:
    """Stop the benchmark, naming what it waited for, once ``deadline`` passed."""
    if time.monotonic() > deadline:
        raise SystemExit(f"bench/fleet.py: no {what} by the deadline; see the runs' logs")


def step_times(run: Run) -> list[float]:
    """Unix times at which the run's trainer finished its steps."""
    try:
        lines = (run.run_dir / "trainer_metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line)["time"] for line in lines if line.strip()]


def cancel(args: argparse.Namespace, spec: Path, base: list[str], env: dict, work: Path, fleet: Path) -> int:
    """``--cancel`` (see the module doc)."""
    import signal

    endless = [*base, "trainer.total_steps=1000000"]
    with running_fleet(fleet, work, env):
        a, b = Run("job-a", work / "job-a"), Run("job-b", work / "job-b")
        started = [launch(a, job_command(spec, endless, a.run_dir, 0, fleet=True), env)]
        deadline = time.monotonic() + STEP_DEADLINE_S
        while a.first_step is None and a.returncode is None:
            past(deadline, "job-a's first step")
            time.sleep(0.2)
        t_b = time.time() + args.phase_s
        time.sleep(args.phase_s)
        print(f"== cancel: {b.name} joins (load {load()})", flush=True)
        started.append(launch(b, job_command(spec, endless, b.run_dir, 1, fleet=True), env))
        deadline = time.monotonic() + STEP_DEADLINE_S
        while b.first_step is None and b.returncode is None:
            past(deadline, "job-b's first step")
            time.sleep(0.2)
        time.sleep(args.phase_s)
        print(f"== cancel: {b.name} cancelled (load {load()})", flush=True)
        t_cancel = time.time()
        b.proc.send_signal(signal.SIGINT)
        time.sleep(args.phase_s)
        t_end = time.time()
        a.proc.send_signal(signal.SIGINT)
        for t, log in started:
            t.join()
            log.close()
    for r in (a, b):
        if r.returncode != 130:
            raise SystemExit(f"{r.name}: exited {r.returncode} after its cancel; see {r.run_dir.parent / (r.name + '.log')}")
        r.ledger = json.loads((r.run_dir / "summary.json").read_text())["ledger"]
    times = step_times(a)

    def rate(t0: float, t1: float) -> float:
        return 60.0 * sum(t0 <= t < t1 for t in times) / (t1 - t0)

    t_first = a.first_step
    third = args.phase_s / 3
    alone = rate(t_first + third, t_b)
    shared = rate(b.first_step + third, t_cancel)
    after = rate(t_cancel + third, t_end)
    recover = float("nan")
    w = 10.0
    t = t_cancel
    while t + w <= t_end:
        if rate(t, t + w) >= 0.9 * alone:
            recover = t + w - t_cancel
            break
        t += 1.0
    lost = sum(r.ledger["audit"]["lost"] + r.ledger["audit"]["trained_twice"] for r in (a, b))
    print(f"  job-a steps: {len(times)}; b's first step {b.first_step - b.launched:.1f}s after its launch; "
          f"load={load()}", flush=True)
    print(f"fleet_cancel recover_s={recover:.1f} steps_per_min_alone={alone:.1f} shared={shared:.1f} "
          f"after={after:.1f} lost={lost}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
