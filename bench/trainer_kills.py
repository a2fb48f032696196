"""Does a job survive its trainer being killed? The same small job, its trainer SIGKILLed, several times in a row.

Each run is a real ``meshrl run`` (tiny model, 8 prompts x 4 samples per step, 6 steps,
``save_freq: 1``, ``queues.lease_idle_s: 15``, ``weights.transfer_timeout_s: 10``); once the
job reaches step ``--kill-at`` the trainer's launcher and its ranks are SIGKILLed, as a lost
machine would, and the supervisor restarts it. Every run goes to its own directory under ``--out``.

    python bench/trainer_kills.py [--runs 10] [--kill-at 3] [--out runs/trainer-kills]

One line per run: ``run=<i> finished=<bool> seconds=<wall> max_in_flight=<prompts> limit=16
group_failures=<k> replica_restarted=<bool> ledger_exact=<bool>``, where ``max_in_flight`` is
the most prompts in flight right after any put, replayed from the run's ``broker.aof``, and
``group_failures`` counts weight transfers whose data group failed to form. Then:
``trainer_kills finished=<k>/<n> max_in_flight=<m> seconds_min=<a> seconds_max=<b> load=<1-min load avg>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.modelling.tiny import build_tiny_model  # noqa: E402
from tests.fixtures.jobs import make_arith_parquet  # noqa: E402
from tests.integration.job_faults_support import Job, admission_trace, assert_ledger_exact  # noqa: E402

LIMIT = 16  # (async.max_staleness 1 + 1) x 8 prompts


def one(run: Path, model: str, data: Path, kill_at: int) -> dict:
    t0 = time.monotonic()
    job = Job(run, model, data, "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
              "queues.lease_idle_s=15", "weights.transfer_timeout_s=10", "trainer.total_steps=6").start()
    finished = False
    try:
        job.wait_step(kill_at)
        job.kill_tree("trainer")
        finished = job.finish(timeout=1200) == 0
    except AssertionError as exc:
        print(f"run {run.name}: {str(exc).splitlines()[0]}", file=sys.stderr)
    finally:
        job.stop()
    trace = admission_trace(run, n=4)
    try:
        assert_ledger_exact(run)
        exact = True
    except (AssertionError, OSError, KeyError, ValueError):
        exact = False
    out = job.output()
    return {"finished": finished, "seconds": time.monotonic() - t0, "max_in_flight": max(trace, default=0),
            "group_failures": job.log("trainer").count("forming the gloo group"),
            "replica_restarted": "rollout-0 exited" in out or "rollout-0 is stuck" in out, "ledger_exact": exact}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--kill-at", type=int, default=3, help="step at which the trainer is killed")
    p.add_argument("--out", default="runs/trainer-kills")
    args = p.parse_args()
    out = Path(args.out)
    model = str(build_tiny_model(out / "model"))
    data = make_arith_parquet(out / "data", train_size=96)
    results = []
    for i in range(args.runs):
        r = one(out / f"run{i}", model, data, args.kill_at)
        results.append(r)
        print(f"run={i} finished={r['finished']} seconds={r['seconds']:.1f} max_in_flight={r['max_in_flight']} "
              f"limit={LIMIT} group_failures={r['group_failures']} replica_restarted={r['replica_restarted']} "
              f"ledger_exact={r['ledger_exact']}", flush=True)
    secs = [r["seconds"] for r in results]
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"trainer_kills finished={sum(r['finished'] for r in results)}/{len(results)} "
          f"max_in_flight={max(r['max_in_flight'] for r in results)} seconds_min={min(secs):.1f} "
          f"seconds_max={max(secs):.1f} load={load}")
    return 0 if all(r["finished"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
