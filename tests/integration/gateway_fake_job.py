"""A stand-in job driver for the gateway/launcher tests: a real program, not a mock.

    python gateway_fake_job.py SPEC --run-dir DIR

It behaves like ``meshrl run`` as the launcher sees it: reads the spec, rewrites
``DIR/status.json`` every step (state, step, total_steps, reward_mean, staleness,
tokens_per_s, queues, detail) and exits. Knobs (environment):

    FAKE_STEPS        steps to run (default 5)
    FAKE_INTERVAL     seconds per step (default 0.1)
    FAKE_EXIT         exit code at the end (default 0); non-zero writes state "failed"
    FAKE_IGNORE_TERM  "1": ignore SIGTERM (so cancel must SIGKILL)
    FAKE_CHILD        "1": start a child process in the same group; its pid goes to DIR/child.pid
    FAKE_GARBAGE      "1": write a status.json with NaN, wrong types and a huge detail each step
    FAKE_SERVICE_LOGS "1": also write DIR/logs/trainer.log and DIR/logs/rollout-0.log, a line per step
                      (rollout-0's first line a "\r" progress bar)
    FAKE_RESTARTS     "1": report ``restarts: {"reward-0": 1}`` in status.json from step 2 on
    FAKE_WEIGHTS      "1": report a canary-mode weight plane (``weights``): v0 promoted, v1 a candidate
                      at rollout-0 from step 1 and promoted at step 2, v2 a candidate at step 2 and
                      rejected at step 3 (rollout-0 back on v1); rollout-1 only ever serves promoted versions
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def write_status(run_dir: Path, **status: object) -> None:
    tmp = run_dir / "status.json.tmp"
    tmp.write_text(json.dumps(status))
    os.replace(tmp, run_dir / "status.json")


def fake_weights(step: int, t0: float) -> dict:
    """The ``weights`` block of status.json at ``step`` (see FAKE_WEIGHTS)."""
    events = [{"ts": t0, "version": 0, "kind": "promoted", "reason": "the trainer's starting weights",
               "measurements": {}}, {"ts": t0 + 0.1, "version": 1, "kind": "candidate", "reason": "", "measurements": {}}]
    promoted, candidate = 0, 1
    if step >= 2:
        events += [{"ts": t0 + 0.2, "version": 1, "kind": "promoted", "reason": "",
                    "measurements": {"logprob_gap": 0.002, "promoted_logprob_gap": 0.001, "samples": 8.0}},
                   {"ts": t0 + 0.3, "version": 2, "kind": "candidate", "reason": "", "measurements": {}}]
        promoted, candidate = 1, 2
    if step >= 3:
        events.append({"ts": t0 + 0.4, "version": 2, "kind": "rejected",
                       "reason": "logprob_gap 0.3700 vs promoted 0.0010 (+0.3690 > 0.1)",
                       "measurements": {"logprob_gap": 0.37, "promoted_logprob_gap": 0.001, "samples": 8.0}})
        candidate = None
    return {"mode": "canary", "promoted": float(promoted), "candidate": candidate, "paused": "",
            "replicas": {"rollout-0": {"served_version": float(candidate if candidate is not None else promoted),
                                       "role": "canary"},
                         "rollout-1": {"served_version": float(promoted), "role": "promoted"}},
            "rejected": {"2": events[-1]["reason"]} if step >= 3 else {}, "events": events}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("spec")
    p.add_argument("--run-dir", required=True)
    args = p.parse_args()
    run_dir = Path(args.run_dir)
    spec_text = Path(args.spec).read_text()  # must exist: the launcher wrote it
    steps = int(os.environ.get("FAKE_STEPS", "5"))
    interval = float(os.environ.get("FAKE_INTERVAL", "0.1"))
    code = int(os.environ.get("FAKE_EXIT", "0"))
    if os.environ.get("FAKE_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_CHILD") == "1":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (run_dir / "child.pid").write_text(str(child.pid))
    print(f"fake job: {len(spec_text)} bytes of spec, {steps} steps", flush=True)
    t0 = time.time()
    weights = os.environ.get("FAKE_WEIGHTS") == "1"
    for step in range(1, steps + 1):
        time.sleep(interval)
        if os.environ.get("FAKE_GARBAGE") == "1":
            (run_dir / "status.json").write_text(
                '{"state": "running", "step": "seven", "reward_mean": NaN, "staleness": Infinity, '
                '"tokens_per_s": true, "queues": {"prompts": "many", "rollouts": -1}, "detail": "%s"}' % ("x" * 100_000)
            )
            continue
        write_status(
            run_dir, state="running", step=step, total_steps=steps, reward_mean=round(step / steps, 4),
            staleness=0.5, tokens_per_s=100.0 + step, queues={"prompts": step, "rollouts": 1, "experience": 0},
            detail=f"step {step}/{steps}", loss=round(1.0 / step, 5), kl=0.001 * step, entropy=2.0 - step / (steps + 1),
            grad_norm=0.5 + (step % 3) * 0.1, **({"val_score": round(step / steps, 4)} if step % 5 == 0 else {}),
            **({"restarts": {"reward-0": 1}} if os.environ.get("FAKE_RESTARTS") == "1" and step >= 2 else {}),
            **({"weights": fake_weights(step, t0)} if weights else {}),
            ledger={"fed": 8 * step, "generated": 8 * step - 2, "scored": 8 * step - 4, "trained": 8 * (step - 1),
                    "failed": 0, "dropped_stale": 0},
        )  # fmt: skip
        print(f"fake job: step {step}", flush=True)
        if os.environ.get("FAKE_SERVICE_LOGS") == "1":
            (run_dir / "logs").mkdir(exist_ok=True)
            for service in ("trainer", "rollout-0"):
                with open(run_dir / "logs" / f"{service}.log", "a") as f:
                    if step == 1 and service == "rollout-0":  # a progress bar, as tqdm writes one
                        f.write("loading 0%\rloading 50%\rloading 100%\r\n")
                    f.write(f"{service}: step {step}\n")
    final = "succeeded" if code == 0 else "failed"
    write_status(run_dir, state=final, step=steps, total_steps=steps, reward_mean=1.0, staleness=0.5,
                 tokens_per_s=100.0 + steps, queues={"prompts": 0, "rollouts": 0, "experience": 0},
                 detail="done" if code == 0 else "trainer crashed: boom",
                 **({"weights": fake_weights(steps, t0)} if weights else {}))  # fmt: skip
    print("fake job: finished", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
