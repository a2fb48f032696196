"""A job's log files, read for ``GET /v1/jobs/{id}/logs`` and the gRPC ``GetJobLogs``.

A job's run dir holds ``job.log`` (the job driver, `meshrl run`) and ``logs/<service>.log``
(one per service: ``trainer``, ``reward-0``, ``rollout-0``, ...). The service ``job`` names
the driver's log. Only names found in the run dir are accepted, and a log is only ever a
regular file of the run dir: a symlink (``logs/x.log -> /etc/shadow``) is no log, and a
file is opened with ``O_NOFOLLOW``, so no request can reach a file outside it.

    log_services(run_dir)                    -> ["job", "reward-0", "rollout-0", "trainer"]
    tail_text(path, lines=200)               -> the last 200 lines (at most MAX_TAIL_BYTES)
    follow(path, offset, finished, max_s)    -> yields new bytes until the job finished or max_s
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

MAX_TAIL_LINES = 10_000
MAX_TAIL_BYTES = 4 << 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class UnknownLog(LookupError):
    """No such service log in the job's run dir (the message lists the ones there are)."""


def _regular(path: Path) -> bool:
    """A regular file itself, not a symlink (to anything)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def log_services(run_dir: Path) -> list[str]:
    """Services with a log in ``run_dir``: ``job`` (the driver) first, then ``logs/*.log`` sorted.
    Symlinks are not logs (one could point anywhere), nor is a ``logs`` dir that is one."""
    out = ["job"] if _regular(run_dir / "job.log") else []
    logs = run_dir / "logs"
    if logs.is_dir() and not logs.is_symlink():
        out += sorted(p.stem for p in logs.glob("*.log")
                      if _regular(p) and _NAME.fullmatch(p.stem) and p.stem != "job")  # fmt: skip
    return out


def open_log(path: Path) -> BinaryIO:
    """Open a log for reading without following a symlink anywhere on the way out of its
    run dir: the last component with ``O_NOFOLLOW``, the rest checked by resolving it."""
    real_dir = Path(os.path.realpath(path.parent))
    expect = Path(os.path.realpath(path.parent.parent if path.parent.name == "logs" else path.parent))
    if path.parent.name == "logs" and (path.parent.is_symlink() or real_dir != expect / "logs"):
        raise UnknownLog("service: the job's logs dir is not a directory of its run dir")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnknownLog("service: not a regular file")
    return os.fdopen(fd, "rb")


def log_path(run_dir: Path, service: str) -> Path:
    """The log file of ``service``; :class:`UnknownLog` if the run dir has none."""
    names = log_services(run_dir)
    if service not in names:
        have = ", ".join(names) if names else "none yet"
        raise UnknownLog(f"service: no log named {service!r} for this job (logs: {have})")
    return run_dir / "job.log" if service == "job" else run_dir / "logs" / f"{service}.log"


def tail_bytes(path: Path, lines: int) -> tuple[bytes, int]:
    """The last ``lines`` lines of ``path`` (bounded by MAX_TAIL_BYTES) and the file size read up to."""
    with open_log(path) as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        if lines <= 0:
            return b"", end
        pos, buf = end, b""
        while pos > 0 and buf.count(b"\n") <= lines and len(buf) < MAX_TAIL_BYTES:
            step = min(64 << 10, pos)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
    ends = buf.endswith(b"\n")
    parts = (buf[:-1] if ends else buf).split(b"\n")
    if len(parts) > lines:
        buf = b"\n".join(parts[-lines:]) + (b"\n" if ends else b"")
    return buf[-MAX_TAIL_BYTES:], end


def follow(path: Path, offset: int, finished: Callable[[], bool], max_seconds: float,
           poll: float = 0.25) -> Iterator[bytes]:  # fmt: skip
    """Yield what is appended to ``path`` after ``offset``, until ``finished()`` (then the
    rest is drained) or ``max_seconds`` pass. While nothing is appended it yields ``b""``
    every ``poll`` seconds, so a caller whose client went away gets control back (and can
    stop) within ``poll``; callers skip the empty chunks."""
    deadline = time.monotonic() + max_seconds
    done = False
    while True:
        try:
            with open_log(path) as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                if size < offset:  # truncated or replaced: start over
                    offset = 0
                f.seek(offset)
                chunk = f.read(MAX_TAIL_BYTES)
        except (FileNotFoundError, UnknownLog):
            chunk = b""
        except OSError:  # ELOOP: the log was replaced by a symlink
            return
        if chunk:
            offset += len(chunk)
            yield chunk
            if time.monotonic() >= deadline:
                return
            continue
        if done or time.monotonic() >= deadline:
            return
        done = finished()  # one more read after the job finished, so its last lines come through
        if not done:
            time.sleep(poll)
            yield b""


__all__ = ["MAX_TAIL_LINES", "UnknownLog", "follow", "log_path", "log_services", "open_log", "tail_bytes"]
