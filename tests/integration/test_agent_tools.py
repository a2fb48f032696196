"""Tool sandboxes with real worker processes: lifecycle, and tools that raise, hang,
return megabytes, crash or use the network. No vLLM."""

from __future__ import annotations

import asyncio
import socket

import pytest

from rollout_svc.tools.sandbox import InProcessTool, ToolSandbox
from services.config.agent import MultiTurnConfig, ToolSpec
from services.procs import pid_alive
from services.sandbox.process import SandboxStartError

DEADLINE = 60


def spec(cls: str, **kw) -> ToolSpec:
    kw.setdefault("num_workers", 1)
    kw.setdefault("timeout_s", 3.0)
    return ToolSpec(class_name=f"tests.agent_tools.{cls}", **kw)


async def _with_box(s: ToolSpec, fn):
    box = await ToolSandbox(s).start()
    try:
        return await asyncio.wait_for(fn(box), DEADLINE)
    finally:
        await box.close()


async def test_lifecycle_state_and_reward() -> None:
    async def body(box: ToolSandbox):
        assert box.name == "echo" and box.schema["function"]["name"] == "echo"
        assert box.network in ("netns", "audit-hook")
        box.open("t1", {"start": 10})
        box.open("t2")
        r = [await box.call("execute", "t1", args={}) for _ in range(2)]
        assert [x.result["text"] for x in r] == ["echo:11", "echo:12"] and all(x.ok for x in r)
        assert (await box.call("execute", "t2", args={})).result["text"] == "echo:1"
        assert (await box.call("reward", "t1")).result == 6.0
        assert (await box.release("t1")).ok
        # t2 keeps its own state
        assert (await box.call("execute", "t2", args={})).result["text"] == "echo:2"

    await _with_box(spec("Echo", num_workers=2), body)


async def test_a_tool_that_raises_gives_an_error_and_keeps_serving() -> None:
    async def body(box):
        r = await box.call("execute", "t", args={})
        assert not r.ok and r.kind == "exception" and "boom from the tool" in r.error
        r2 = await box.call("execute", "t", args={})
        assert not r2.ok and r2.kind == "exception" and box.restarts == 0

    await _with_box(spec("Raises"), body)


async def test_a_tool_that_hangs_is_killed_at_its_deadline_and_replaced() -> None:
    async def body(box):
        pid = box._slots[0].proc.pid
        r = await box.call("execute", "t", args={})
        assert not r.ok and r.kind == "timeout" and "deadline" in r.error
        # ended by the deadline it was given (nothing else), and the hung worker is gone
        assert "exceeded its 1s deadline" in r.error and not pid_alive(pid)
        assert box.restarts == 1 and box._slots[0].proc.pid != pid
        r = await box.call("execute", "t", args={})  # the instance is re-created in the new worker
        assert r.kind == "timeout"

    await _with_box(spec("Hangs", timeout_s=1.0), body)


async def test_a_tool_that_returns_megabytes_gets_an_error_and_the_worker_is_replaced() -> None:
    async def body(box):
        r = await box.call("execute", "t", args={})
        assert not r.ok and r.kind == "too_large" and "65536 bytes" in r.error
        assert box.restarts == 1

    await _with_box(spec("Huge", max_result_bytes=65536), body)


async def test_state_lost_with_a_replaced_worker_is_recreated() -> None:
    async def body(box):
        box.open("t", {"start": 5})
        assert (await box.call("execute", "t", args={})).result["text"] == "echo:6"
        box._slots[0].proc.kill()  # the worker dies between calls
        r = await box.call("execute", "t", args={})
        assert r.ok and r.result["text"] == "echo:6"  # re-created from its create_kwargs
        assert box.restarts == 1

    await _with_box(spec("Echo"), body)


def _listener() -> socket.socket:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(5)
    return srv


async def test_no_network_unless_allowed() -> None:
    """A local listener (no outside network needed): the sandboxed tool cannot reach it; the
    same tool with allow_network reaches it and its bytes arrive."""
    with _listener() as srv:
        port = srv.getsockname()[1]

        async def denied(box):
            assert box.network == "netns"
            r = await box.call("execute", "t", args={"port": port})
            assert not r.ok and r.kind == "exception", r
            assert "refused" in r.error or "unreachable" in r.error, r.error

        await _with_box(spec("NetworkProbe"), denied)
        srv.settimeout(0.5)
        with pytest.raises(TimeoutError):
            srv.accept()  # nothing ever connected to the host's listener

        async def allowed(box):
            assert box.network == "allowed"
            r = await box.call("execute", "t", args={"port": port})
            assert r.ok and r.result["text"] == "connected", r

        srv.settimeout(5)
        await _with_box(spec("NetworkProbe", allow_network=True), allowed)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(100) == b"hello from the tool"


async def test_many_concurrent_calls_nothing_hangs() -> None:
    async def body(box):
        for i in range(16):
            box.open(f"t{i}")
        rs = await asyncio.gather(*(box.call("execute", f"t{i}", args={}) for i in range(16)))
        assert all(r.ok and r.result["text"] == "echo:1" for r in rs)

    await _with_box(spec("Echo", num_workers=3), body)


async def test_calls_queued_behind_a_hung_call_are_answered_by_the_new_worker() -> None:
    """Calls to one worker are pipelined: the hung call at the head times out, the worker is
    replaced once, and the calls queued behind it are sent again and answered."""

    async def body(box):
        assert box.hooks == frozenset()  # the class overrides none of create/reward/release
        pid = box._slots[0].proc.pid
        hung = asyncio.ensure_future(box.call("execute", "h", args={"hang": True}))
        await asyncio.sleep(0)  # the hanging call goes first
        rest = [box.call("execute", f"t{i}", args={}) for i in range(8)]
        replies = await asyncio.gather(hung, *rest)
        assert replies[0].kind == "timeout"
        new_pid = box._slots[0].proc.pid
        assert box.restarts == 1 and new_pid != pid
        tags = {r.result["text"] for r in replies[1:]}
        assert len(tags) == 1 and tags.pop().endswith(":1")  # all 8 answered once, by the one new worker
        worker_tag = replies[1].result["text"].rsplit(":", 1)[0]
        # a caller that gives up while queued does not disturb the calls after it
        queued = asyncio.ensure_future(box.call("execute", "t0", args={}))
        await asyncio.sleep(0)
        queued.cancel()
        after = await box.call("execute", "t1", args={})
        assert after.ok and after.result["text"] == f"{worker_tag}:2"
        # reward and release of a class without them are answered here, not by the worker
        assert (await box.call("reward", "t1")).ok and (await box.release("t1")).ok

    await _with_box(spec("HangsWhenAsked", timeout_s=1.0), body)


async def test_a_class_with_lifecycle_methods_gets_them_called() -> None:
    async def body(box):
        assert box.hooks == {"create", "reward", "release"}
        box.open("t", {"start": 2})
        assert (await box.call("execute", "t", args={})).result["text"] == "echo:3"
        assert (await box.call("reward", "t")).result == 1.5
        assert (await box.release("t")).ok
        box.open("t")  # released: a new instance starts from create's default
        assert (await box.call("execute", "t", args={})).result["text"] == "echo:1"

    await _with_box(spec("Echo"), body)


async def test_a_trusted_tool_runs_in_process_only_when_the_spec_asks() -> None:
    assert spec("Echo").sandbox is True  # the default: sandboxed workers
    box = await InProcessTool(spec("Echo", sandbox=False)).start()
    assert box.name == "echo" and box.hooks == {"create", "reward", "release"} and box.network == "in-process"
    box.open("t", {"start": 4})
    assert (await box.call("execute", "t", args={})).result == {"text": "echo:5", "metrics": {"n": 5}}
    assert (await box.call("reward", "t")).result == 2.5
    assert (await box.release("t")).ok and (await box.call("execute", "t", args={})).result["text"] == "echo:1"
    raises = await InProcessTool(spec("Raises", sandbox=False)).start()
    r = await raises.call("execute", "t", args={})
    assert not r.ok and r.kind == "exception" and "boom from the tool" in r.error
    huge = await InProcessTool(spec("Huge", sandbox=False, max_result_bytes=65536)).start()
    r = await huge.call("execute", "t", args={})
    assert not r.ok and r.kind == "too_large"
    with pytest.raises(SandboxStartError, match="not a subclass"):
        await InProcessTool(ToolSpec(class_name="tests.agent_tools.CallOnce", sandbox=False)).start()


async def test_bad_class_fails_at_start_with_the_reason() -> None:
    with pytest.raises(SandboxStartError, match="not a subclass"):
        await ToolSandbox(ToolSpec(class_name="tests.agent_tools.CallOnce", num_workers=1)).start()
    with pytest.raises(SandboxStartError, match="No module named"):
        await ToolSandbox(ToolSpec(class_name="no_such_pkg_xyz.Tool", num_workers=1)).start()


def test_config_errors_name_the_key(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs at least one tool"):
        MultiTurnConfig(enable=True)
    with pytest.raises(ValueError, match="class_name"):
        ToolSpec(class_name="not a path")
    f = tmp_path / "tools.yaml"
    f.write_text("tools:\n  - class_name: tests.agent_tools.Echo\n    config: {}\n")
    mt = MultiTurnConfig(enable=True, tool_config_path=str(f), tools=[spec("Raises")])
    assert [t.class_name for t in mt.all_tools()] == ["tests.agent_tools.Raises", "tests.agent_tools.Echo"]
    f.write_text("tools:\n  - class_nam: x.Y\n")
    with pytest.raises(ValueError, match=r"tool_config_path: tools\[0\]"):
        MultiTurnConfig(enable=True, tool_config_path=str(f)).all_tools()
