"""CPU seconds per service of a running job, from its process tree (a helper of the benchmarks
that run ``meshrl run``; not a benchmark itself).

``TreeSampler(pid).sample()``, called every fraction of a second while the job runs, records
the CPU time of every process under ``pid`` and which service it belongs to (the nearest
ancestor, itself included, started as ``python -m <service>``; anything else is the
controller). A process's last sample counts after it exits, so short-lived helpers are missed
only between samples.
"""

from __future__ import annotations

SERVICES = ("trainer_svc", "rollout_svc", "reward_svc", "feeder_svc")


class TreeSampler:
    """CPU seconds per service, from the process tree under the controller's pid."""

    def __init__(self, root_pid: int) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(root_pid)
        self.seen: dict[int, tuple[str, float]] = {}

    def _service_of(self, proc) -> str:
        chain = [proc]
        try:
            chain += proc.parents()
        except self.psutil.Error:
            pass
        for p in chain:
            try:
                cmd = " ".join(p.cmdline())
            except self.psutil.Error:
                continue
            for s in SERVICES:
                if f"-m {s}" in cmd:
                    return s.removesuffix("_svc")
        return "controller"

    def sample(self) -> None:
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except self.psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                cpu = t.user + t.system
            except self.psutil.Error:
                continue
            name = self.seen[p.pid][0] if p.pid in self.seen else self._service_of(p)
            self.seen[p.pid] = (name, cpu)

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, cpu in self.seen.values():
            out[name] = out.get(name, 0.0) + cpu
        return out
