"""Benchmark: 3-turn tool trajectories through the agent loop vs single-turn completions
by vLLM directly, for the same number of model tokens, in the same run on one engine.

One ``AsyncLLM`` (the replica's :class:`~rollout_svc.engine.RolloutEngine`, tiny model,
temperature 1, per-request seeds, ``ignore_eos`` so every request generates exactly its
``max_tokens``) serves both sides:

(a) direct: ``--trajectories`` requests of ``3 x --turn-tokens`` tokens each, all submitted
    at once to ``AsyncLLM.generate``, timed from the first submit to the last output;
(b) agent: ``--trajectories`` trajectories through :class:`rollout_svc.agent.loop.AgentLoop`,
    each its own task: three model turns of ``--turn-tokens`` tokens, with a call to the
    sandboxed calculator tool after each of the first two, whose observation is rendered
    through the chat template and appended (``max_assistant_turns: 3``). Every turn after the
    first sends the context so far; prefix caching (on, as in a replica) reuses its whole
    KV blocks, so the engine runs with ``rollout.block_size`` ``--block-size`` (32; vLLM's
    CPU default of 128 is larger than a turn's 64 tokens and turn 2 would prefill again).

Both sides produce the same number of model tokens (checked). The tool is a real sandboxed
call, but near-instant. Its summed latency is printed, and the agent side's time excludes
it: the wall time minus the time during which every in-flight trajectory was waiting on a
tool. The sides alternate over ``--repeats`` runs after a warm-up, ``--settle`` seconds apart,
and the medians are compared. Each run also prints the CPU seconds spent by this process and
by its children (engine core, vLLM worker, tool sandboxes), which load on a shared machine
does not change the way it changes wall time.

Last line: ``agent ratio_vs_single_turn=<agent model-tokens/s / direct> trajectories_per_s=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout_svc.agent.parsers import ParsedTurn, ToolCall, ToolCallParser  # noqa: E402


class AlwaysCalc(ToolCallParser):
    """Every model turn calls the calculator (the loop's ``max_assistant_turns`` ends it)."""

    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content="", calls=[ToolCall("calc", {"expr": "6*7"})])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model dir (default: build the tiny model into a temp dir)")
    p.add_argument("--trajectories", type=int, default=128, help="trajectories (and direct requests) per run")
    p.add_argument("--turn-tokens", type=int, default=64, help="model tokens per turn")
    p.add_argument("--repeats", type=int, default=4, help="timed runs per side, alternating which goes first")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between runs (vLLM worker spin-down)")
    p.add_argument("--tool-workers", type=int, default=2, help="sandbox workers of the calculator")
    p.add_argument("--in-process-tool", action="store_true",
                   help="run the calculator inside this process (ToolSpec.sandbox: false) instead of sandboxed")
    p.add_argument("--block-size", type=int, default=32,
                   help="KV-cache block size (rollout.block_size; 0 = vLLM's default, 128 on CPU)")
    return p.parse_args(argv)


def _prompts(model: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return [tok.apply_chat_template([{"role": "user", "content": f"{10 + i % 90}*{11 + i % 89}="}],
                                    add_generation_prompt=True, tokenize=True, return_dict=False)
            for i in range(count)]


async def _direct(engine, prompts, tokens: int, tag: str) -> tuple[int, float]:
    sampling = engine.cfg.sampling_for(False)

    async def one(ids, sid):
        out = await engine._generate_checked(list(ids), sampling, sid, max_tokens=tokens)
        assert not out.error, out.error
        return len(out.response_ids)

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(p, f"{tag}/{i}") for i, p in enumerate(prompts)))
    return sum(counts), time.perf_counter() - t0


class ToolClock:
    """Time during which every trajectory in flight waits on a tool (nothing to generate)."""

    def __init__(self) -> None:
        self.in_flight = self.in_tool = 0
        self.idle_s = 0.0
        self._since: float | None = None

    def change(self, flight: int = 0, tool: int = 0) -> None:
        now = time.perf_counter()
        if self._since is not None:
            self.idle_s += now - self._since
        self.in_flight += flight
        self.in_tool += tool
        self._since = now if self.in_flight and self.in_tool == self.in_flight else None


async def _agent(agent, prompts, tag: str, clock: ToolClock) -> tuple[int, float, float, float]:
    sampling = agent.cfg.sampling_for(False)
    run_calls = agent._run_calls

    async def timed_calls(*a, **kw):
        clock.change(tool=+1)
        try:
            return await run_calls(*a, **kw)
        finally:
            clock.change(tool=-1)

    agent._run_calls = timed_calls

    async def one(ids, sid):
        clock.change(flight=+1)
        try:
            return await agent.run_trajectory(list(ids), sampling, sid, {})
        finally:
            clock.change(flight=-1)

    clock.idle_s = 0.0
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(one(p, f"{tag}/{i}") for i, p in enumerate(prompts)))
    wall = time.perf_counter() - t0
    agent._run_calls = run_calls
    for t in trajs:
        assert not t.error and t.assistant_turns == 3 and t.tool_errors == 0, (t.error, t.assistant_turns, t.tool_errors)
    model_tokens = sum(sum(t.response_mask) for t in trajs)
    tool_s = sum(t.tool_latency_s for t in trajs)
    return model_tokens, wall, clock.idle_s, tool_s


class CpuMeter:
    """CPU seconds (user + system) spent by this process and by its child processes (vLLM's
    engine core and worker, the tool's sandbox workers) between ``start`` and ``stop``: what a
    side costs, whatever else the machine runs at the time."""

    def __init__(self) -> None:
        import psutil

        self.me = psutil.Process()

    def _sample(self) -> tuple[float, float]:
        import psutil

        t = self.me.cpu_times()
        kids = 0.0
        for c in self.me.children(recursive=True):
            try:
                ct = c.cpu_times()
                kids += ct.user + ct.system
            except psutil.Error:
                pass
        return t.user + t.system, kids

    def start(self) -> None:
        self._t0 = self._sample()

    def stop(self) -> str:
        me, kids = self._sample()
        return f"cpu: main process {me - self._t0[0]:.2f}s, child processes {kids - self._t0[1]:.2f}s"


async def run(args, model: str) -> int:
    from rollout_svc.agent.loop import AgentLoop
    from rollout_svc.engine import RolloutEngine
    from services.config.rollout import RolloutConfig

    t = args.turn_tokens
    cfg = RolloutConfig(
        prompt_length=32, response_length=3 * t + 128, n=1, temperature=1.0, seed=0, ignore_eos=True,
        max_num_seqs=256, enable_prefix_caching=True, block_size=args.block_size or None,
        multi_turn={"enable": True, "format": f"{__name__}.AlwaysCalc", "max_assistant_turns": 3,
                    "max_tokens_per_turn": t,
                    "tools": [{"class_name": "rollout_svc.tools.calculator.Calculator",
                               "num_workers": args.tool_workers, "timeout_s": 30,
                               "sandbox": not args.in_process_tool}]},
    )
    engine = RolloutEngine(cfg, model)
    await engine.start()
    agent = await AgentLoop(engine, cfg).start()
    clock = ToolClock()
    cpu = CpuMeter()
    try:
        prompts = _prompts(model, args.trajectories)
        await _direct(engine, prompts[:16], 3 * t, "warm-d")
        await _agent(agent, prompts[:16], "warm-a", clock)
        direct_tps, agent_tps, traj_ps = [], [], []
        for r in range(args.repeats):
            order = ("direct", "agent") if r % 2 == 0 else ("agent", "direct")
            for side in order:
                await asyncio.sleep(args.settle)
                cpu.start()
                if side == "direct":
                    n, secs = await _direct(engine, prompts, 3 * t, f"d{r}")
                    direct_tps.append(n / secs)
                    print(f"run {r} direct: {n} tokens in {secs:.2f}s = {n / secs:.0f} tokens/s; {cpu.stop()}",
                          flush=True)
                else:
                    n, wall, idle, tool_s = await _agent(agent, prompts, f"a{r}", clock)
                    secs = wall - idle
                    agent_tps.append(n / secs)
                    traj_ps.append(len(prompts) / secs)
                    print(f"run {r} agent: {n} model tokens in {wall:.2f}s wall, {idle:.3f}s all-waiting-on-tools "
                          f"excluded -> {n / secs:.0f} tokens/s; tool calls {2 * len(prompts)}, summed tool "
                          f"latency {tool_s:.2f}s; {cpu.stop()}", flush=True)
        assert n == 3 * t * len(prompts)
        d, a = statistics.median(direct_tps), statistics.median(agent_tps)
        print(f"median direct single-turn: {d:.0f} tokens/s; median agent 3-turn: {a:.0f} model tokens/s")
        print(f"agent ratio_vs_single_turn={a / d:.3f} trajectories_per_s={statistics.median(traj_ps):.1f}")
        return 0
    finally:
        await agent.close()
        engine.shutdown()


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model = args.model
    with tempfile.TemporaryDirectory(prefix="meshrl-bench-agent-") as tmp:
        if model is None:
            from services.modelling.tiny import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "model"))
        return asyncio.run(run(args, model))


if __name__ == "__main__":
    sys.exit(main())
