"""Helpers of the fault tests: a real ``meshrl run`` job, driven and hurt from outside the
way a user would (pids from ``status.json``, signals), and the ledger checks."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: a small, fast job: 4 prompts x 4 samples per step, checkpoint every step, short leases
BASE_OVERRIDES = (
    "data.val_files=[]", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4",
    "trainer.save_freq=1", "queues.lease_idle_s=8", "services.restart.backoff_s=0.5",
    "services.restart.heartbeat_timeout_s=40", "services.restart.stall_timeout_s=300",
)


class Job:
    """One ``meshrl run`` subprocess on ``run_dir`` (same command again = resume)."""

    def __init__(self, run_dir: Path, model: str, data: Path, *overrides: str) -> None:
        self.run_dir = run_dir
        self.argv = [sys.executable, "-m", "meshrl_cli", "run", str(REPO / "examples/quickstart.yaml"),
                     f"model.path={model}", f"data.train_files={data}", *BASE_OVERRIDES, *overrides,
                     "--run-dir", str(run_dir), "--no-progress"]
        self.proc: subprocess.Popen | None = None
        self.out = run_dir.parent / f"{run_dir.name}.out"

    def start(self) -> "Job":
        """Start (or, on the same run dir, resume) the job, in a process group of its own."""
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.out, "ab") as f:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True)
        return self

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def status(self) -> dict:
        try:
            return json.loads((self.run_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_for(self, pred, what: str, timeout: float = 400.0) -> dict:
        """Poll status.json until ``pred(status)``; fail with the job's output otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st and pred(st):
                return st
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"job ended (rc={self.proc.returncode}) before {what}:\n{self.output()[-4000:]}")
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}; status {self.status()}\n{self.output()[-4000:]}")

    def wait_step(self, step: int, timeout: float = 1200.0) -> dict:
        return self.wait_for(lambda s: s.get("state") == "running" and s.get("step", 0) >= step, f"step {step}", timeout)

    def pid(self, service: str) -> int:
        return int(self.status()["services"][service]["pid"])

    def kill(self, service: str, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to ``service``'s process (pid from status.json), as a user would."""
        pid = self.pid(service)
        os.kill(pid, sig)
        return pid

    def kill_tree(self, service: str) -> int:
        """SIGKILL ``service`` and every process it started (the trainer's ranks, a replica's
        vLLM engine): the machine under it failed. Returns the service's pid."""
        pid = self.pid(service)
        for p in [pid, *descendants(pid)]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pid

    def kill_all(self) -> None:
        """SIGKILL the whole job at once (its process group: driver and every service), as a
        lost machine would; the same command resumes it."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def log(self, service: str) -> str:
        path = self.run_dir / "logs" / f"{service}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_back(self, service: str, old_pid: int, timeout: float = 900.0) -> dict:
        """Until ``service`` runs again under a new pid, ready."""
        return self.wait_for(lambda s: s["services"][service]["pid"] != old_pid and s["services"][service]["alive"]
                             and not s["services"][service]["restarting"], f"{service} restarted", timeout)

    def trained_since_restart(self) -> int | None:
        """The last version the trainer's current incarnation applied (its log since its last
        ``resumed from`` line); None while it has trained nothing."""
        log = self.log("trainer")
        since = max(log.rfind("resumed from"), 0)
        versions = re.findall(r"meshrl\.trainer: step \d+ version (\d+) applied", log[since:])
        return int(versions[-1]) if versions else None

    def wait_trained_since_restart(self, timeout: float = 600.0) -> int:
        """Until the restarted trainer has trained a step of its own; returns its version. (The
        step in ``status.json`` can lag the trainer by a poll: after a restart it may still be
        the step of the incarnation before.)"""
        self.wait_for(lambda _: self.trained_since_restart() is not None, "a step of the restarted trainer", timeout)
        return self.trained_since_restart()

    def wait_served(self, replica: str, version: int, timeout: float) -> None:
        """Until ``replica``'s log says it serves ``version`` or a later one."""
        deadline = time.monotonic() + timeout
        while not any(v >= version for _, v in served_versions(self.log(replica))):
            if time.monotonic() > deadline:
                raise AssertionError(f"{replica} did not serve version {version} within {timeout}s; it served "
                                     f"{served_versions(self.log(replica))[-5:]}\n{self.output()[-3000:]}")
            time.sleep(0.5)

    def finish(self, timeout: float = 1500.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=90)
            raise AssertionError(f"job did not finish in {timeout}s:\n{self.output()[-4000:]}") from None

    def stop(self) -> None:
        """Teardown: SIGTERM the driver if it is still running (it stops its services)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def assert_ledger_exact(run_dir: Path) -> dict:
    """The finished job's ledger: nothing lost, nothing trained twice, the counts add up."""
    summary = json.loads((run_dir / "summary.json").read_text())
    ledger = summary["ledger"]
    audit = ledger["audit"]
    assert audit["lost"] == 0, ledger
    assert audit["trained_twice"] == 0, ledger
    assert ledger["trained"] + ledger["dropped_stale"] + ledger["dropped_error"] + ledger["in_flight"] == ledger["fed"]
    assert audit["trained_ids"] == ledger["trained"], ledger
    return ledger


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def admission_trace(run_dir: Path, n: int) -> list[int]:
    """Prompts in flight right after each training prompt was put, replayed from the embedded
    broker's append-only file (``broker.aof``) alone: a prompt is in flight from its put
    until every one of its ``n`` samples has a final ledger stage (trained, nonfinite,
    dropped). Exact whatever the feeder believed; a compaction snapshot (written when the
    broker starts again) is a consistent state, and its puts are not counted as new."""
    from services.queues.aof import replay

    final = {"trained", "nonfinite", "dropped"}
    training = re.compile(r"-e\d+-p\d+$")  # a training prompt's uid (validation rounds are -val<r>-p<i>)
    stage: dict[str, str] = {}
    pending: dict[str, None] = {}
    trace: list[int] = []

    def done(uid: str) -> bool:
        return all(stage.get(f"{uid}/{k}") in final for k in range(n))

    for rec in replay(run_dir / "broker.aof"):
        if rec[0] == "L":
            for sid in rec[2]:
                stage[sid] = rec[1]
                uid = sid.rpartition("/")[0]
                if uid in pending and done(uid):
                    del pending[uid]
            for sid in rec[2]:
                if rec[1] == "queued" and training.search(sid) and not done(sid):
                    pending[sid] = None
        elif rec[0] == "P" and rec[1] == "prompts" and len(rec) == 7:  # a live put, not a snapshot's entry
            uids = [u for u in rec[5] if training.search(u)]
            if uids:
                trace.append(len(pending) + sum(1 for u in uids if u not in pending))
    return trace


def _log_time(line: str) -> float | None:
    m = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def first_versions_after_restarts(trainer_log: str) -> list[tuple[float, int]]:
    """For every trainer incarnation that resumed from a checkpoint: (when it resumed, the
    version its first training step published)."""
    out, resumed_at = [], None
    for line in trainer_log.splitlines():
        if "resumed from" in line:
            resumed_at = _log_time(line)
        m = re.search(r"meshrl.trainer: step \d+ version (\d+) applied", line)
        if m and resumed_at is not None:
            out.append((resumed_at, int(m.group(1))))
            resumed_at = None
    return out


def served_versions(replica_log: str) -> list[tuple[float, int]]:
    """(when, version) of every version the replica reported serving."""
    out = []
    for line in replica_log.splitlines():
        m = re.search(r"now serves policy version (\d+)", line)
        if m and (t := _log_time(line)) is not None:
            out.append((t, int(m.group(1))))
    return out
