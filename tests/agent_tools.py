"""Tool classes for the agent tests (imported by dotted path inside sandbox workers)."""

from __future__ import annotations

import os
import time
from typing import Any

from rollout_svc.agent.parsers import ParsedTurn, ToolCall, ToolCallParser
from rollout_svc.tools import Tool


def _schema(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": name,
                                             "parameters": {"type": "object", "properties": {}}}}


class Echo(Tool):
    """Answers ``echo:<n>`` where n counts the calls of this instance; rewards 0.5 per call."""

    schema = _schema("echo")

    def __init__(self, config=None, schema=None):
        super().__init__(config, schema)
        self.calls: dict[str, int] = {}

    def create(self, instance_id, **kw):
        self.calls[instance_id] = int(kw.get("start", 0))

    def execute(self, instance_id, arguments, **kw):
        self.calls[instance_id] += 1
        return {"text": f"echo:{self.calls[instance_id]}", "metrics": {"n": self.calls[instance_id]}}

    def reward(self, instance_id, **kw):
        return 0.5 * self.calls.get(instance_id, 0)

    def release(self, instance_id, **kw):
        self.calls.pop(instance_id, None)


class Raises(Tool):
    schema = _schema("raises")

    def execute(self, instance_id, arguments, **kw):
        raise RuntimeError("boom from the tool")


class Hangs(Tool):
    schema = _schema("hangs")

    def execute(self, instance_id, arguments, **kw):
        while True:
            time.sleep(1)


class Huge(Tool):
    schema = _schema("huge")

    def execute(self, instance_id, arguments, **kw):
        return "x" * (8 << 20)  # 8 MB


class WaitsForFile(Tool):
    """Returns once the file named in ``config.path`` exists (the test creates it)."""

    schema = _schema("wait")

    def execute(self, instance_id, arguments, **kw):
        path = self.config["path"]
        while not os.path.exists(path):
            time.sleep(0.05)
        return "done"


class NetworkProbe(Tool):
    schema = _schema("net")

    def execute(self, instance_id, arguments, **kw):
        import socket

        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", int(arguments["port"])))  # a listener the test opened on this machine
            s.sendall(b"hello from the tool")
            return "connected"
        finally:
            s.close()


class HangsWhenAsked(Tool):
    """Hangs on ``{"hang": true}``; otherwise answers with its process id and the instance's
    call count (no create/reward/release of its own: those are never sent to it)."""

    schema = _schema("maybe_hang")

    def __init__(self, config=None, schema=None):
        super().__init__(config, schema)
        self.calls: dict[str, int] = {}

    def execute(self, instance_id, arguments, **kw):
        if isinstance(arguments, dict) and arguments.get("hang"):
            while True:
                time.sleep(1)
        self.calls[instance_id] = self.calls.get(instance_id, 0) + 1
        return f"{PROCESS_TAG}:{self.calls[instance_id]}"


#: Names this worker process (in a sandbox's own pid namespace every worker is pid 2).
PROCESS_TAG = f"{os.getpid()}-{os.urandom(4).hex()}"


class CallOnce(ToolCallParser):
    """Calls ``echo`` on every turn; pair with ``max_assistant_turns``."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, calls=[ToolCall("echo", {})])


class CallWait(ToolCallParser):
    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, calls=[ToolCall("wait", {})])


class CallAllFailing(ToolCallParser):
    """Every turn calls the three failing tools and one that does not exist."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, calls=[ToolCall("raises", {}), ToolCall("hangs", {}), ToolCall("huge", {}),
                                               ToolCall("nope", {})])


class Snoop(Tool):
    """A hostile tool: tries what the sandbox must stop (tests/integration/test_job_confinement.py).
    ``arguments``: ``read`` (paths), ``write`` (paths), ``connect`` ([host, port] pairs);
    answers JSON ``{what: "ok" | "<ExceptionName>"}``, plus ``scratch`` (a write to its own
    scratch dir, read back) and ``uid``."""

    schema = _schema("snoop")

    def execute(self, instance_id, arguments, **kw):
        import json
        import socket

        out = {}
        for p in arguments.get("read", []):
            try:
                with open(p, "rb") as fh:
                    fh.read(1)
                out[f"read {p}"] = "ok"
            except Exception as exc:  # noqa: BLE001 - the outcome is the answer
                out[f"read {p}"] = type(exc).__name__
        for p in arguments.get("write", []):
            try:
                with open(p, "w") as fh:
                    fh.write("pwned")
                out[f"write {p}"] = "ok"
            except Exception as exc:  # noqa: BLE001
                out[f"write {p}"] = type(exc).__name__
        for host, port in arguments.get("connect", []):
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
                out[f"connect {host}:{port}"] = "ok"
            except Exception as exc:  # noqa: BLE001
                out[f"connect {host}:{port}"] = type(exc).__name__
        with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "scratch.txt"), "w") as fh:
            fh.write("mine")
        with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "scratch.txt")) as fh:
            out["scratch"] = fh.read()
        out["uid"] = os.getuid()
        out["limits"] = _limits()
        return json.dumps(out)


def _limits() -> dict:
    """This process's resource limits, whether it can raise one, and its descriptors' targets."""
    import resource

    out: dict = {name: list(resource.getrlimit(getattr(resource, "RLIMIT_" + name)))
                 for name in ("AS", "CPU", "NPROC", "FSIZE", "NOFILE", "CORE")}
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (out["NPROC"][0] + 1, out["NPROC"][1] + 1))
        out["raise"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the outcome is the answer
        out["raise"] = type(exc).__name__
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    out["fds"] = fds
    return out
