"""A stand-in job driver that runs the job's user code the way the job's services do.

    python sandbox_job.py SPEC --run-dir DIR

Launched by the gateway's local launcher (so in the job's process group, with the job's
umask and environment), it starts, from the submitted spec, the reward sandbox pool the
reward service would start (``reward_svc.server.sandbox_spec``) and one tool sandbox per
tool the replica would start (``rollout_svc.tools.sandbox.ToolSandbox``), with the job's
inputs handed down as ``meshrl run`` hands them (``controller_svc.mesh.sandbox_inputs``).
Then it scores one sample and calls each tool once with the probe in
``DIR/probe-request.json`` (written by the test after submit; the driver waits for it),
writes what came back to ``DIR/probe.json`` (the job's credential is held open, inheritable,
while the workers start: none may inherit it), and keeps the workers alive (their bwrap pids
in ``DIR/workers.json``) until SIGTERM, so the test can pause the job and look at them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path


def write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    run_dir = Path(args.run_dir)

    from controller_svc.mesh import sandbox_inputs
    from reward_svc.sandbox.pool import SandboxPool
    from reward_svc.server import sandbox_spec
    from rollout_svc.tools.sandbox import ToolSandbox
    from services.config.job import load_job
    from services.sandbox.confine import INPUTS_ENV

    spec = load_job(args.spec)
    os.environ[INPUTS_ENV] = os.pathsep.join(sandbox_inputs(spec))
    write_json(run_dir / "status.json", {"state": "running", "step": 0, "total_steps": 1})
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    deadline = time.monotonic() + 60
    while not (run_dir / "probe-request.json").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    probe = json.loads((run_dir / "probe-request.json").read_text())

    # a secret held open and inheritable while the workers start: none of them may get it
    held = os.open(run_dir / "job.credential", os.O_RDONLY)
    os.set_inheritable(held, True)
    pool = SandboxPool(sandbox_spec(spec.reward)).start()
    boxes = [await ToolSandbox(t).start() for t in spec.rollout.multi_turn.all_tools()]
    os.close(held)
    try:
        sample = {"data_source": "probe", "solution_str": "42", "ground_truth": "42",
                  "extra_info": {"probe": probe}}
        res = pool.score([sample])[0]
        out = {"reward": {"score": res.score, "extra": res.extra, "error": res.error}, "tools": []}
        for box in boxes:
            r = await box.call("execute", "probe", args=probe)
            out["tools"].append({"ok": r.ok, "result": r.result, "error": r.error, "network": box.network})
        workers = [w.proc.pid for w in list(pool._idle.queue) if w is not None]
        workers += [s.proc.proc.pid for box in boxes for s in box._slots if s.proc is not None]
        write_json(run_dir / "workers.json", workers)
        write_json(run_dir / "probe.json", out)
        await stop.wait()
    finally:
        for box in boxes:
            await box.close()
        pool.close()
    write_json(run_dir / "status.json", {"state": "cancelled", "step": 1, "total_steps": 1})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
