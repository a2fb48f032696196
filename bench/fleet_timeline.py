"""Benchmark: the timeline of one job's start on a warm fleet (issue 43: its first sample
within 5 s of ``meshrl run``).

A fleet of one replica is started (``meshrl fleet start``, as ``bench/fleet.py`` does; not
timed), then the quick start's job with a rank-8 adapter (``bench/fleet.py``'s job) runs on
it ``--repeat`` times, one after the other. While each runs, a watcher polls every 20 ms:

- each line of ``meshrl run``'s own output and of every service's log, when it first shows
  (a service's log appears when the controller spawns it; ``MESHRL_READY`` is its ready line;
  the feeder prints its phases: imports, tokenizer, prompts);
- ``feeder.hold`` gone (the controller released the feeder), ``feeder.json`` written (its
  first put);
- on the replica's metrics (the job's port): groups in flight above 0 (the first lease) and
  samples above 0 (the first sample, as ``bench/fleet.py`` times it);
- the first line of ``trainer_metrics.jsonl`` (the first step).

Each event is printed with its seconds since the launch; the last line of each run:

    timeline run=<i> first_put_s=<s> first_lease_s=<s> first_sample_s=<s> first_step_s=<s> load=<1/5/15 min>

``--steps`` (default 3) keeps each run short; ``--set KEY=VALUE`` adds an override.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet import FLEET, ROOT, fleet_spec, job_command, load, running_fleet  # noqa: E402

POLL_S = 0.02
#: service log lines worth a row (besides MESHRL_READY and every feeder line)
KEEP = ("attached", "took the job", "feeding before", "ready", "handed to fleet", "Traceback", "Error")


class Watcher:
    """Events of one run: (seconds since launch, source, text)."""

    def __init__(self, run_dir: Path, console: Path, launched: float) -> None:
        self.run_dir, self.console, self.launched = run_dir, console, launched
        self.events: list[tuple[float, str, str]] = []
        self._offsets: dict[Path, int] = {}
        self._seen: set[str] = set()
        self.first: dict[str, float] = {}

    def mark(self, key: str, source: str, text: str, now: float) -> None:
        if key not in self.first:
            self.first[key] = now - self.launched
            self.events.append((now - self.launched, source, text))

    def _lines(self, path: Path, source: str, now: float) -> None:
        try:
            size = path.stat().st_size
        except OSError:
            return
        if path not in self._offsets:
            self._offsets[path] = 0
            self.mark(f"spawn:{source}", source, "log file appears (spawned)", now)
        if size <= self._offsets[path]:
            return
        with open(path, "rb") as f:
            f.seek(self._offsets[path])
            chunk = f.read(size - self._offsets[path])
        cut = chunk.rfind(b"\n") + 1
        self._offsets[path] += cut
        for raw in chunk[:cut].decode("utf-8", "replace").splitlines():
            line = raw.strip()
            if not line:
                continue
            if line.startswith("MESHRL_READY"):
                self.events.append((now - self.launched, source, "MESHRL_READY"))
            elif source in ("feeder", "meshrl run") or any(k in line for k in KEEP):
                self.events.append((now - self.launched, source, line[:150]))

    def poll(self, scrape_url: str | None) -> None:
        now = time.time()
        self._lines(self.console, "meshrl run", now)
        logs = self.run_dir / "logs"
        if logs.is_dir():
            for p in sorted(logs.glob("*.log")):
                self._lines(p, p.stem, now)
        if (self.run_dir / "status.json").exists():
            self.mark("status", "controller", "status.json written", now)
        hold = self.run_dir / "feeder.hold"
        if hold.exists():
            self.mark("hold", "controller", "feeder.hold written", now)
        elif "hold" in self.first:
            self.mark("release", "controller", "feeder.hold removed (feeder released)", now)
        if (self.run_dir / "feeder.json").exists():
            self.mark("first_put", "feeder", "feeder.json written (first put done)", now)
        steps = self.run_dir / "trainer_metrics.jsonl"
        if "first_step" not in self.first and steps.exists() and steps.stat().st_size:
            self.mark("first_step", "trainer", "first step in trainer_metrics.jsonl", now)


def metrics_url(run_dir: Path) -> str | None:
    import yaml

    try:
        res = yaml.safe_load((run_dir / "config" / "rollout-0.yaml").read_text())["resources"]
    except (OSError, KeyError, TypeError, ValueError):
        return None
    return f"http://{res['host']}:{res['metrics_port']}/metrics"


def scraper(w: Watcher, stop: threading.Event) -> None:
    """The replica's metrics for the job, as often as they answer (a thread of its own)."""
    from services.metrics.scrape import scrape

    url = None
    while not stop.is_set() and "sample" not in w.first:
        url = url or metrics_url(w.run_dir)
        if url is None:
            time.sleep(POLL_S)
            continue
        m = scrape(url, timeout=0.5)
        now = time.time()
        if m.get("meshrl_rollout_groups_in_flight", 0) > 0 or m.get("meshrl_rollout_samples_total", 0) > 0:
            w.mark("lease", "replica", "groups in flight > 0 (first lease)", now)
        if m.get("meshrl_rollout_samples_total", 0) > 0:
            w.mark("sample", "replica", "samples_total > 0 (first sample)", now)
        time.sleep(POLL_S)


def one_run(i: int, spec: Path, base: list[str], work: Path, env: dict) -> dict[str, float]:
    run_dir = work / f"timeline-{i}"
    console = work / f"timeline-{i}.log"
    cmd = job_command(spec, base, run_dir, i, fleet=True)
    with open(console, "w") as log:
        launched = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        w = Watcher(run_dir, console, launched)
        stop = threading.Event()
        t = threading.Thread(target=scraper, args=(w, stop), daemon=True)
        t.start()
        while proc.poll() is None:
            w.poll(None)
            time.sleep(POLL_S)
        w.poll(None)
        stop.set()
        t.join(2)
    if proc.returncode != 0:
        raise SystemExit(f"run {i}: meshrl run exited {proc.returncode}; see {console}:\n{console.read_text()[-3000:]}")
    print(f"== run {i} ({run_dir})", flush=True)
    for at, source, text in sorted(w.events, key=lambda e: e[0]):
        if at > w.first.get("first_step", float("inf")) + 0.5:
            break
        print(f"  {at:6.2f}s  {source:12s} {text}", flush=True)
    f = w.first
    print(f"timeline run={i} first_put_s={f.get('first_put', float('nan')):.2f} "
          f"first_lease_s={f.get('lease', float('nan')):.2f} first_sample_s={f.get('sample', float('nan')):.2f} "
          f"first_step_s={f.get('first_step', float('nan')):.2f} load={load()}", flush=True)
    return f


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="runs, one after the other (default 3)")
    p.add_argument("--steps", type=int, default=3, help="RL steps per run (default 3)")
    p.add_argument("--workdir", default=None, help="models, data, runs and the fleet (default: a temp dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an extra override of every run")
    args = p.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="meshrl-timeline-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MESHRL_FLEETS_DIR=str(work / "fleets"))
    from meshrl_cli.quickstart import prepare

    model, data, _ = prepare(work / "quickstart", 0, 50, log=lambda line: print(line, flush=True))
    spec = ROOT / "examples" / "quickstart.yaml"
    base = [f"model.path={model}", f"data.train_files={data / 'train.parquet'}", "data.val_files=[]",
            "model.lora_rank=8", "model.lora_alpha=16", "actor.optim.lr=5e-3", f"trainer.total_steps={args.steps}",
            "trainer.val_before_train=false", "trainer.test_freq=-1", *args.set]
    fargs = argparse.Namespace(jobs=1, elastic=False)
    firsts = []
    with running_fleet(fleet_spec(work, model, 8, (32, 6), fargs), work, env):
        time.sleep(2.0)  # the fleet's start settles
        for i in range(args.repeat):
            print(f"== run {i}: launch (load {load()})", flush=True)
            firsts.append(one_run(i, spec, base, work, env))
    samples = sorted(f.get("sample", float("nan")) for f in firsts)
    print(f"timeline runs={len(firsts)} first_sample_s median={samples[len(samples) // 2]:.2f} "
          f"all={','.join(f'{s:.2f}' for s in samples)} fleet={FLEET}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
