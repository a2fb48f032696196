"""Does the quick start learn every time? ``meshrl quickstart`` with several seeds, one after another.

Each seed changes the tiny model's initial weights, the supervised warm start, the prompt
order and the sampling; everything else is README's quick start as it is. Every run goes to
its own directory under ``--out``.

    python bench/quickstart_seeds.py [--seeds 0,1,2,3,4] [--target 0.85]

One line per seed (``seed=<s> reward_start=<A> reward_end=<B> minutes=<M>``), then:
``quickstart_seeds min_reward_end=<lowest> mean_reward_end=<mean> runs_at_target=<k>/<n> rewards=<b0,b1,...>``
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^quickstart reward_start=(\S+) reward_end=(\S+) steps=(\d+) minutes=(\S+)$", re.M)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--out", default="runs/quickstart-seeds")
    p.add_argument("overrides", nargs="*", help="a.b=c overrides passed to every run")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    ends: list[float] = []
    for seed in seeds:
        out = Path(args.out) / f"seed-{seed}"
        cmd = [sys.executable, "-m", "meshrl_cli", "quickstart", "--out", str(out), "--seed", str(seed),
               "--no-progress", *args.overrides]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        m = LINE.search(proc.stdout)
        if proc.returncode != 0 or m is None:
            print(f"seed={seed} FAILED (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-1500:]}", flush=True)
            ends.append(float("nan"))
            continue
        start, end, _, minutes = m.groups()
        ends.append(float(end))
        print(f"seed={seed} reward_start={start} reward_end={end} minutes={minutes}", flush=True)
    ok = [e for e in ends if e == e]
    hits = sum(1 for e in ok if e >= args.target)
    print(f"quickstart_seeds min_reward_end={min(ends) if ok and len(ok) == len(ends) else float('nan'):.3f} "
          f"mean_reward_end={(sum(ok) / len(ok)) if ok else float('nan'):.3f} runs_at_target={hits}/{len(ends)} "
          f"rewards={','.join(f'{e:.3f}' for e in ends)}")
    return 0 if hits == len(ends) else 1


if __name__ == "__main__":
    sys.exit(main())
