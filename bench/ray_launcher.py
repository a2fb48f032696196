"""Benchmark: the same short job through the local launcher and through the Ray launcher
(``services.launcher=ray``) on a local multi-node Ray cluster, same run, same machine.

Both runs are the whole mesh (``meshrl run``: embedded broker, one vLLM replica, one reward
worker, one FSDP2 trainer rank) on the same tiny model, data and seed. The local run goes
first, with no Ray on the machine; then a Ray cluster is started here -- a head with no CPUs
and two worker nodes, ``{rollout: 1, reward: 1}`` and ``{trainer: 1}`` -- and the job runs
again with each service in its own actor on the node its spec asks for. The Ray figure so
pays for everything Ray adds: its daemons on the same cores, the placement group, the actors.
The cluster is the least Ray runs (``--lean``, the default): no dashboard, log monitors,
metrics collection or workers started ahead of demand; ``--full-cluster`` keeps them all.

Throughput is trained samples per second from the end of the first step to the end of the
last, clocked by the trainer's own step lines (``logs/trainer.log``; start-up is not in it);
``start_s`` is the Ray run's seconds from the driver's start to its first finished step
(connecting, placing, starting the services, the first step). For each run it also prints
where the CPU went in that window (``cpu_s``: CPU seconds of the services -- trainer, replica
with its vLLM engine, reward worker --, of the driver, and of everything Ray runs) and the
trainer's busy fraction (its step time over the window: below 1 it waited for samples).

    python bench/ray_launcher.py [--steps 30 --batch 16 --n 8 --response 16]

Last line: ``ray_launcher ratio_vs_local=<trained samples/s on Ray / local> start_s=<s>``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--batch", type=int, default=16, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    p.add_argument("--response", type=int, default=16, help="data.max_response_length (tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the model, data and runs go (default: a temp dir)")
    p.add_argument("--full-cluster", action="store_true",
                   help="the Ray nodes with their dashboard, log monitors, metrics and prestarted workers")
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
    cmd = [sys.executable, "-m", "meshrl_cli", "run", str(ROOT / "examples" / "quickstart.yaml"), *overrides,
           "--run-dir", str(run_dir), "--no-progress"]
    t0 = time.monotonic()
    with CpuSampler() as cpu, open(work / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: meshrl run exited {proc.returncode}\n{(work / f'{name}.log').read_text()[-3000:]}")
    hist = json.loads((run_dir / "summary.json").read_text())["history"]
    ends = step_ends(run_dir / "logs" / "trainer.log")
    if sorted(ends) != list(range(1, args.steps + 1)):
        raise SystemExit(f"{name}: the trainer's log has steps {sorted(ends)}, not 1..{args.steps}")
    t_first, t_last = ends[1], ends[args.steps]
    samples = (args.steps - 1) * args.batch * args.n
    busy = 0.0
    with open(run_dir / "trainer_metrics.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if rec["step"] > 1:
                busy += sum(rec["seconds"].values())
    return {"name": name, "wall_s": wall, "first_step_s": hist[0]["t"], "train_s": t_last - t_first,
            "samples_per_s": samples / max(t_last - t_first, 1e-9), "busy": busy / max(t_last - t_first, 1e-9),
            "cpu": cpu.between(t_first, t_last)}


STEP_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) trainer\[0\] INFO meshrl\.trainer: step (\d+) version")


def step_ends(log: Path) -> dict[int, float]:
    """When each step ended (epoch seconds), from the trainer's ``step N version`` lines
    (logging's local time, millisecond resolution); the last line of a step counts."""
    out: dict[int, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = STEP_LINE.match(line)
        if m:
            out[int(m.group(2))] = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


class CpuSampler:
    """CPU seconds of this benchmark's descendants, sampled from /proc every 0.5 s, by kind:
    ``services`` (a ``trainer_svc``/``rollout_svc``/``reward_svc`` process and what it
    started: ranks, vLLM's engine), ``driver`` (``meshrl run``), ``ray`` (everything else:
    the nodes' daemons, the actors' worker processes)."""

    SERVICES = ("-m trainer_svc", "-m rollout_svc", "-m reward_svc")

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.kind: dict[int, str] = {}
        self.samples: list[tuple[float, dict[int, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        from services.procs import all_proc_stats

        me = os.getpid()
        while not self._stop.is_set():
            now, procs = time.time(), {}
            for st in all_proc_stats():
                procs[st.pid] = (st.ppid, st.cpu_ticks / self._tick)
            cpu: dict[int, float] = {}
            for pid, (ppid, used) in procs.items():
                kind = self._classify(pid, ppid, procs, me)
                if kind is not None:
                    cpu[pid] = used
            self.samples.append((now, cpu))
            self._stop.wait(self.period_s)

    def _classify(self, pid: int, ppid: int, procs: dict, me: int, depth: int = 0) -> str | None:
        """Kind of a descendant of this process (decided once, from its command line and its
        parent's kind), else None."""
        if pid in self.kind:
            return self.kind[pid]
        if ppid == me:
            parent = "top"
        elif ppid in procs and depth < 64:
            parent = self._classify(ppid, procs[ppid][0], procs, me, depth + 1)
        else:
            parent = None
        if parent is None:
            return None  # not ours
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        if parent == "services" or any(s in cmd for s in self.SERVICES):
            kind = "services"
        elif "meshrl_cli run" in cmd:
            kind = "driver"
        elif parent == "driver":
            kind = "driver"  # its own helpers
        else:
            kind = "ray"  # `ray start` and below: the daemons, the actors' workers
        self.kind[pid] = kind
        return kind

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds by kind from ``t0`` to ``t1`` (a process born or gone in between counts
        from 0 or until its last sample)."""
        if not self.samples:
            return {}
        first = min(self.samples, key=lambda s: abs(s[0] - t0))[1]
        inside = [c for t, c in self.samples if t0 <= t <= t1]
        out = {"services": 0.0, "driver": 0.0, "ray": 0.0}
        last: dict[int, float] = {}
        for c in inside:
            last.update(c)
        for pid, used in last.items():
            out[self.kind[pid]] += max(0.0, used - first.get(pid, 0.0))
        return out


def line(r: dict) -> str:
    cpu = " ".join(f"{k}={v:.1f}" for k, v in r["cpu"].items())
    return (f"samples_per_s={r['samples_per_s']:.1f} train_s={r['train_s']:.1f} first_step_s={r['first_step_s']:.1f} "
            f"wall_s={r['wall_s']:.1f} trainer_busy={r['busy']:.2f} cpu_s {cpu}")


def main() -> int:
    from tests.fixtures.ray_nodes import RayNodes

    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="meshrl-ray-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model, train = prepare(work, args.seed)
    local = run("local", work, model, train, args, [])
    print(f"local  {line(local)}", flush=True)
    with RayNodes("bench", dashboard=args.full_cluster, lean=not args.full_cluster) as cluster:
        t0 = time.monotonic()
        cluster.start_head()
        cluster.add_worker(2, {"rollout": 1, "reward": 1})
        cluster.add_worker(2, {"trainer": 1})
        print(f"ray cluster up in {time.monotonic() - t0:.1f}s at {cluster.address}", flush=True)
        ray = run("ray", work, model, train, args, [
            "services.launcher=ray", f"services.ray.address={cluster.address}",
            "services.trainer.ray.resources={trainer: 1}", "services.rollout.ray.resources={rollout: 1}",
            "services.reward.ray.resources={reward: 1}"])
    print(f"ray    {line(ray)}", flush=True)
    print(f"ray_launcher ratio_vs_local={ray['samples_per_s'] / local['samples_per_s']:.3f} "
          f"start_s={ray['first_step_s']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
