"""The one readiness announcement every meshrl service prints, and its one parser.

When a service can do its work it prints exactly one line on stdout::

    MESHRL_READY {"service": "trainer", "id": "trainer", "pid": 123, "addresses": {"metrics": "127.0.0.1:9103"}, ...}

``service`` is trainer / rollout / reward / feeder; ``id`` the instance (replica, consumer
name); ``addresses`` maps each endpoint (``metrics``, ``grpc``, ``weights``) to
``host:port``; further keys are facts a launcher or a test may check (``world_size``,
``device``, ``dtype``, ``version``, ``step``). Launchers (``controller_svc``) and tests
read it with :func:`parse_ready_line` / :func:`wait_for_ready`; nothing parses it by hand.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

PREFIX = "MESHRL_READY "


@dataclass(frozen=True)
class Ready:
    """A parsed readiness line."""

    service: str
    id: str
    pid: int
    addresses: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def address(self, name: str) -> str:
        """``host:port`` of endpoint ``name``; KeyError naming what exists otherwise."""
        try:
            return self.addresses[name]
        except KeyError:
            raise KeyError(f"{self.service} {self.id} announced no {name!r} address (has {sorted(self.addresses)})") from None

    def port(self, name: str) -> int:
        return int(self.address(name).rsplit(":", 1)[1])


def ready_line(service: str, id: str, addresses: dict[str, str], **info: Any) -> str:
    """The announcement line (without newline)."""
    body = {"service": service, "id": id, "pid": os.getpid(), "addresses": dict(addresses), **info}
    return PREFIX + json.dumps(body, sort_keys=False, default=str)


def announce_ready(service: str, id: str, addresses: dict[str, str], *, stream: IO[str] | None = None, **info: Any) -> None:
    """Print the readiness line on stdout (flushed)."""
    out = stream or sys.stdout
    out.write(ready_line(service, id, addresses, **info) + "\n")
    out.flush()


def parse_ready_line(line: str) -> Ready | None:
    """The :class:`Ready` in ``line``, or None if the line is not an announcement.
    A line with the prefix but a broken body raises ValueError."""
    line = line.strip()
    if not line.startswith(PREFIX):
        return None
    try:
        body = json.loads(line[len(PREFIX):])
        service, id_, pid = str(body.pop("service")), str(body.pop("id")), int(body.pop("pid"))
        addresses = body.pop("addresses")
        if not isinstance(addresses, dict):
            raise TypeError("addresses is not a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed readiness line {line[:200]!r}: {exc}") from None
    return Ready(service, id_, pid, {str(k): str(v) for k, v in addresses.items()}, body)


def find_ready(text: str) -> Ready | None:
    """The first announcement in ``text`` (e.g. a log file), or None."""
    for line in text.splitlines():
        r = parse_ready_line(line)
        if r is not None:
            return r
    return None


class NotReady(RuntimeError):
    """The process exited, or the deadline passed, before it announced readiness."""


class OutputWatcher:
    """Reads a child's stdout (a text pipe) on a thread, for as long as the child runs --
    so the pipe never fills -- keeping every line, and finds the readiness line.

        proc = subprocess.Popen([...], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ready = OutputWatcher(proc).wait(timeout=120)     # Ready, or NotReady with the output tail
    """

    def __init__(self, proc: Any, *, echo: IO[str] | None = None) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.ready: Ready | None = None
        self._event = threading.Event()
        self._echo = echo
        self._thread = threading.Thread(target=self._pump, name=f"output-{proc.pid}", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for line in self.proc.stdout:
                self.lines.append(line)
                if self._echo is not None:
                    self._echo.write(line)
                if self.ready is None:
                    try:
                        self.ready = parse_ready_line(line)
                    except ValueError:
                        self.ready = None
                    if self.ready is not None:
                        self._event.set()
        finally:
            self._event.set()

    def wait(self, timeout: float) -> Ready:
        if not self._event.wait(timeout) or self.ready is None:
            why = "did not announce readiness within %.0fs" % timeout if self.ready is None and self.proc.poll() is None \
                else f"exited with code {self.proc.poll()} before announcing readiness"
            raise NotReady(f"process {self.proc.pid} {why}; last output:\n{self.text(40)}")
        return self.ready

    def text(self, last: int | None = None) -> str:
        lines = list(self.lines)
        return "".join(lines if last is None else lines[-last:])


def scan_log_for_ready(log: Path, offset: int = 0) -> tuple[Ready | None, int]:
    """One look at ``log`` from byte ``offset``: (the readiness line among the complete lines
    written since, or None; the offset to look from next time). Never blocks."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return None, offset
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        r = parse_ready_line(line)
        if r is not None:
            return r, offset + len(complete)
    return None, offset + len(complete)


def wait_for_ready_in_log(proc: Any, log: Path, timeout: float, poll_s: float = 0.2, *, offset: int = 0,
                          should_stop: Any = lambda: False) -> Ready | None:
    """Wait until ``log`` (where ``proc`` writes its output), from byte ``offset`` on, holds
    the readiness line; None if ``should_stop()`` becomes true first. Raises
    :class:`NotReady` with the log's tail if ``proc`` exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not should_stop():
        r, offset = scan_log_for_ready(log, offset)
        if r is not None:
            return r
        if proc.poll() is not None:
            raise NotReady(f"exited with code {proc.returncode} before announcing readiness; "
                           f"last lines of {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise NotReady(f"did not announce readiness within {timeout:.0f}s; last lines of {log}:\n{_tail(log)}")
        time.sleep(poll_s)
    return None


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except FileNotFoundError:
        return "(no output)"
