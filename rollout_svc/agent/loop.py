"""The per-request agent loop: one asyncio task per trajectory on the replica's engine.

For each sample of a prompt group a trajectory runs on its own (no barrier between the
samples of a group, nor between groups; the engine batches whatever turns are in flight):

    RUNNING:      generate a model turn (seeded per sample and turn) with what is left of
                  the token budget (``response_length``, shared by all turns);
                  stop if the model answered (no tool call), the budget is spent, or
                  ``max_assistant_turns`` / ``max_user_turns`` is reached;
    TOOL_CALLING: parse the calls (``multi_turn.format``), run up to
                  ``max_parallel_calls`` of them concurrently in their sandboxes;
                  every failure (unknown tool, malformed call, exception, timeout,
                  oversized reply, crash) becomes an error observation;
                  render the observations through the chat template, append them
                  (``response_mask`` 0) unless they would not fit the budget;
    COMPLETED:    each tool instance's ``reward`` (the environment's reward), then
                  ``release`` -- always, whatever happened.

The model's tokens are never re-tokenized: the ids vLLM sampled are the ids trained on,
with their log-probs. Turn ``t`` records the policy version served when it started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from rollout_svc.agent.parsers import ParsedTurn, get_parser
from rollout_svc.agent.trajectory import COMPLETED, RUNNING, TOOL_CALLING, Trajectory
from rollout_svc.tools.sandbox import InProcessTool, ToolReply, ToolSandbox
from services.config.rollout import RolloutConfig, SamplingConfig

log = logging.getLogger(__name__)

_MARK = "MESHRLTURNMARK"


class AgentMetrics:
    """Prometheus metrics of the agent loop (in the replica's registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.trajectories = Counter("meshrl_rollout_agent_trajectories", "Trajectories finished", ["finish"], registry=r)
        self.turns = Histogram("meshrl_rollout_agent_turns", "Model turns per trajectory", registry=r,
                               buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 50))
        self.tool_calls = Counter("meshrl_rollout_agent_tool_calls", "Tool calls made", ["tool"], registry=r)
        self.tool_errors = Counter("meshrl_rollout_agent_tool_errors", "Tool calls that failed", ["tool", "kind"],
                                   registry=r)
        self.tool_latency = Histogram("meshrl_rollout_agent_tool_latency_seconds", "Seconds per tool call", ["tool"],
                                      registry=r, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60))


def truncate_text(text: str, limit: int, side: str) -> str:
    """verl's truncation of a long tool answer (``left`` keeps the start, ``right`` the end)."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = max(1, limit // 2)
    return text[:half] + "...(truncated)..." + text[-half:]


class ObservationRenderer:
    """Token ids of observation messages as the chat template renders them after a model turn.

    The delta is what the template puts after an assistant message and its end-of-turn
    token: the observation messages and the next generation prompt. When the model's turn
    did not end with an end-of-turn token (it was cut by ``max_tokens_per_turn``), the delta
    starts with the template's end-of-turn text, which closes the turn.
    """

    def __init__(self, tokenizer: Any, eos_token_ids: list[int]) -> None:
        self.tok = tokenizer
        self.eos_ids = set(eos_token_ids)
        self.eos_texts = [tokenizer.decode([e]) for e in sorted(self.eos_ids)]

    def render(self, messages: list[dict[str, Any]], turn_closed: bool) -> list[int]:
        base = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
        text = self.tok.apply_chat_template(base + messages, add_generation_prompt=True, tokenize=False)
        at = text.find(_MARK)
        if at < 0:
            raise ValueError("the chat template dropped the assistant message; cannot render observations")
        delta = text[at + len(_MARK):]
        if turn_closed:
            for eos in self.eos_texts:
                if eos and delta.startswith(eos):
                    delta = delta[len(eos):]
                    break
        return [int(t) for t in self.tok.encode(delta, add_special_tokens=False)]


class AgentLoop:
    """Runs trajectories on ``engine`` with the tools of ``cfg.multi_turn``.

    Args:
        engine: a started :class:`rollout_svc.engine.RolloutEngine`.
        cfg: the rollout block (``multi_turn`` must be enabled).
        registry: Prometheus registry for :class:`AgentMetrics`.
    """

    def __init__(self, engine: Any, cfg: RolloutConfig, *, registry: CollectorRegistry | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.mt = cfg.multi_turn
        self.parser = get_parser(self.mt.format)
        self.metrics = AgentMetrics(registry)
        self.tools: dict[str, ToolSandbox | InProcessTool] = {}
        self.renderer: ObservationRenderer | None = None
        self.trajectories_in_flight = 0

    async def start(self) -> "AgentLoop":
        """Start every tool's sandbox (and read their names/schemas); the engine must be started."""
        boxes = [ToolSandbox(spec) if spec.sandbox else InProcessTool(spec) for spec in self.mt.all_tools()]
        try:
            await asyncio.gather(*(b.start() for b in boxes))
        except BaseException:
            for b in boxes:
                await b.close()
            raise
        for b in boxes:
            if b.name in self.tools:
                raise ValueError(f"rollout.multi_turn.tools: two tools are named {b.name!r}")
            self.tools[b.name] = b
        tok = self.engine.llm.get_tokenizer()
        self.renderer = ObservationRenderer(tok, self.engine.eos_token_ids)
        self._decode = tok.decode
        return self

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [b.schema for b in self.tools.values()]

    async def close(self) -> None:
        for b in self.tools.values():
            await b.close()

    # -- one group ---------------------------------------------------------------------------

    async def run_group(
        self, prompt_ids: list[int], sampling: SamplingConfig, sample_ids: list[str], tools_kwargs: Any = None
    ) -> list[Trajectory]:
        """``len(sample_ids)`` trajectories of one prompt, each its own task.

        With ``on_weight_update="abort_requeue"`` a group in which a turn was aborted by a
        weight update is run again whole (its tools re-created), as single-turn groups are.
        """
        err = self.engine.check_prompt(prompt_ids)
        if err:
            return [Trajectory(prompt_ids=[], policy_version=self.engine.version, finish_reason="error", error=err)
                    for _ in sample_ids]
        ids = [int(t) for t in prompt_ids]
        kw = tools_kwargs if isinstance(tools_kwargs, dict) else {}
        while True:
            epoch = self.engine._abort_epoch
            trajs = list(await asyncio.gather(*(self.run_trajectory(ids, sampling, s, kw) for s in sample_ids)))
            aborted = any(t.finish_reason == "abort" for t in trajs)
            if not aborted or self.engine.llm is None or self.engine._abort_epoch == epoch:
                return trajs
            log.info("agent group %s aborted by a weight update; running it again", sample_ids[0])

    # -- one trajectory ----------------------------------------------------------------------

    async def run_trajectory(
        self, prompt_ids: list[int], sampling: SamplingConfig, sample_id: str, tools_kwargs: dict[str, Any]
    ) -> Trajectory:
        traj = Trajectory(prompt_ids=list(prompt_ids), policy_version=self.engine.version)
        budget = self.cfg.response_length
        per_turn = self.mt.max_tokens_per_turn or budget
        opened: set[str] = set()
        self.trajectories_in_flight += 1
        try:
            while True:
                traj.state = RUNNING
                left = budget - len(traj.response_ids)
                if left <= 0:
                    traj.finish_reason = "length"
                    break
                ctx = traj.prompt_ids + traj.response_ids
                out = await self.engine._generate_checked(
                    ctx, sampling, sample_id, max_tokens=min(per_turn, left),
                    seed_key=f"{sample_id}#turn{traj.assistant_turns}",
                )
                if out.error:
                    traj.error, traj.finish_reason = out.error, "error"
                    break
                traj.add_model_turn(out.response_ids, out.log_probs, out.policy_version)
                traj.finish_reason = out.finish_reason
                if out.finish_reason == "abort":
                    break
                if len(traj.response_ids) >= budget:
                    traj.finish_reason = "length"
                    break
                parsed = self.parser.parse(self._decode(out.response_ids, skip_special_tokens=True))
                if not parsed.wants_tools:
                    traj.finish_reason = "stop"
                    break
                if self.mt.max_assistant_turns and traj.assistant_turns >= self.mt.max_assistant_turns:
                    traj.finish_reason = "max_turns"
                    break
                if self.mt.max_user_turns and traj.user_turns >= self.mt.max_user_turns:
                    traj.finish_reason = "max_turns"
                    break
                traj.state = TOOL_CALLING
                messages = await self._run_calls(traj, parsed, sample_id, tools_kwargs, opened)
                closed = bool(out.response_ids) and out.response_ids[-1] in self.renderer.eos_ids
                obs = self.renderer.render(messages, turn_closed=closed)
                if len(traj.response_ids) + len(obs) >= budget:
                    traj.finish_reason = "length"  # the trajectory ends on a model turn (verl does the same)
                    break
                traj.add_observation(obs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or a dead engine: this sample fails, the replica goes on
            from rollout_svc.engine import EngineDeadError

            if isinstance(exc, EngineDeadError):
                raise
            log.exception("agent trajectory %s failed", sample_id)
            traj.error, traj.finish_reason = f"agent: {type(exc).__name__}: {exc}", "error"
        finally:
            self.trajectories_in_flight -= 1
            await self._finish_tools(traj, sample_id, tools_kwargs, opened)
            traj.state = COMPLETED
        self.metrics.trajectories.labels(traj.finish_reason).inc()
        self.metrics.turns.observe(traj.assistant_turns)
        return traj

    def _kwargs(self, tools_kwargs: dict[str, Any], tool: str, key: str) -> dict[str, Any]:
        per_tool = tools_kwargs.get(tool) if isinstance(tools_kwargs, dict) else None
        val = per_tool.get(key) if isinstance(per_tool, dict) else None
        return dict(val) if isinstance(val, dict) else {}

    async def _run_calls(
        self, traj: Trajectory, parsed: ParsedTurn, sample_id: str, tools_kwargs: dict[str, Any], opened: set[str]
    ) -> list[dict[str, Any]]:
        """Run the turn's calls; one observation message per call (errors included), in order."""
        role, prefix, mt = self.mt.tool_role, self.mt.tool_error_prefix, self.mt
        texts: list[str | None] = []
        jobs = []
        for e in parsed.errors:
            traj.tool_errors += 1
            self.metrics.tool_errors.labels("-", "malformed").inc()
            texts.append(prefix + e.message)
        for call in parsed.calls[: mt.max_parallel_calls]:
            traj.tool_calls += 1
            box = self.tools.get(call.name)
            if box is None:
                traj.tool_errors += 1
                self.metrics.tool_errors.labels("-", "unknown_tool").inc()
                texts.append(f"{prefix}unknown tool {call.name!r} (available: {', '.join(sorted(self.tools))})")
                continue
            iid = f"{sample_id}/{call.name}"
            if call.name not in opened:
                box.open(iid, self._kwargs(tools_kwargs, call.name, "create_kwargs"))
                opened.add(call.name)
            self.metrics.tool_calls.labels(call.name).inc()
            texts.append(None)
            jobs.append((len(texts) - 1, call.name, box.call(
                "execute", iid, args=call.arguments, kwargs=self._kwargs(tools_kwargs, call.name, "execute_kwargs"))))
        replies: list[ToolReply] = list(await asyncio.gather(*(j[2] for j in jobs)))
        for (pos, name, _), rep in zip(jobs, replies):
            traj.tool_latency_s += rep.latency_s
            self.metrics.tool_latency.labels(name).observe(rep.latency_s)
            if rep.ok and isinstance(rep.result, dict):
                text = rep.result.get("text", "")
                step = rep.result.get("reward")
                if isinstance(step, (int, float)):
                    traj.tool_rewards[name] = traj.tool_rewards.get(name, 0.0) + float(step)
            else:
                traj.tool_errors += 1
                self.metrics.tool_errors.labels(name, rep.kind or "exception").inc()
                text = prefix + (rep.error or "tool failed")
            texts[pos] = truncate_text(str(text), mt.max_tool_response_length, mt.tool_response_truncate_side)
        return [{"role": role, "content": t or ""} for t in texts]

    async def _finish_tools(self, traj: Trajectory, sample_id: str, tools_kwargs: dict[str, Any], opened: set[str]):
        """Environment rewards, then release, for every tool instance the trajectory used."""
        for name in sorted(opened):
            box, iid = self.tools[name], f"{sample_id}/{name}"
            try:
                if not traj.error:
                    rep = await box.call("reward", iid, kwargs=self._kwargs(tools_kwargs, name, "calc_reward_kwargs"))
                    if rep.ok and isinstance(rep.result, (int, float)):
                        traj.tool_rewards[name] = traj.tool_rewards.get(name, 0.0) + float(rep.result)
                    elif not rep.ok:
                        self.metrics.tool_errors.labels(name, f"reward_{rep.kind or 'exception'}").inc()
            finally:
                await box.release(iid, self._kwargs(tools_kwargs, name, "release_kwargs"))
