"""Which CPUs a service runs on: ``services.<service>.cpus`` (a Linux CPU list, "0", "1-3",
"0,2"), applied by the service process itself at start so that it holds under every
launcher (``meshrl run``, a deployment's worker, Ray). Children inherit it: a trainer's
ranks, a replica's vLLM engine core and workers, a reward worker's sandboxes.

On a machine with few cores the services compete for them; pinning the trainer to some
cores and the replica to the others lets generation and training overlap without
oversubscribing either (docs/async.md has the measurements).
"""

from __future__ import annotations

import os
import re

_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_cpu_list(text: str) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]``; ValueError on anything else (empty, reversed ranges)."""
    text = text.replace(" ", "")
    if not _CPU_LIST.match(text):
        raise ValueError(f"{text!r} is not a CPU list (e.g. '0', '1-3', '0,2')")
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last < first:
            raise ValueError(f"CPU range {part!r} runs backwards")
        out.update(range(first, last + 1))
    return sorted(out)


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def pin(cpus: str | None, key: str, *, vllm: bool = False) -> list[int]:
    """Restrict this process (and what it starts) to ``cpus``; None = leave as is. Returns
    the CPUs it may use. ``vllm``: also bind vLLM's CPU-backend OpenMP threads to them
    (its default binds them by NUMA node, whatever the affinity). ValueError, naming
    ``key``, for CPUs this process may not use."""
    if cpus is None:
        return available_cpus()
    wanted = parse_cpu_list(cpus)
    allowed = set(available_cpus())
    missing = [c for c in wanted if c not in allowed]
    if missing:
        raise ValueError(f"{key}={cpus!r}: CPUs {missing} are not available here (this process may use {sorted(allowed)})")
    os.sched_setaffinity(0, wanted)
    if vllm and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, wanted))
        # vLLM reserves a CPU for its engine's own Python threads; with the replica on few
        # CPUs it must reserve none (they share the pinned ones).
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return wanted
