"""The ``rollout.multi_turn`` block: agentic rollouts (multi-turn, tool calls).

Key names follow verl's ``actor_rollout_ref.rollout.multi_turn.*`` (``enable``,
``max_assistant_turns``, ``max_user_turns``, ``max_parallel_calls``,
``max_tool_response_length``, ``tool_response_truncate_side``, ``tool_config_path``,
``format``). Tools are listed inline under ``tools`` or in a YAML file at
``tool_config_path`` (verl's layout: ``tools: [{class_name, config, tool_schema}]``).
Per dataset row, ``extra_info.tools_kwargs`` passes ``create_kwargs`` /
``execute_kwargs`` / ``calc_reward_kwargs`` / ``release_kwargs`` per tool name, as in verl.

Every tool runs in its own pool of sandboxed worker processes (the reward sandbox's
isolation: memory limit, no network unless ``allow_network``, a deadline per call).
Imports only pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from services.config.base import StrictModel
from services.config.loader import resolve_path

_DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"


class ToolSpec(StrictModel):
    """One tool (or environment): a user class located by dotted path, and its sandbox limits."""

    class_name: str = Field(
        ...,
        max_length=512,
        pattern=_DOTTED,
        description="dotted path of the tool class, e.g. mypkg.tools.Calculator (a subclass of "
        "rollout_svc.tools.Tool; imported only inside the sandbox workers)",
    )
    config: dict[str, Any] = Field(default_factory=dict, description="passed to the class constructor (plain JSON values)")
    tool_schema: dict[str, Any] | None = Field(
        None,
        description="OpenAI function-tool schema ({type: function, function: {name, description, parameters}}); "
        "None = the class's own `schema`",
    )
    num_workers: int = Field(2, ge=1, le=256, description="sandbox worker processes of this tool")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="deadline of one call (create/execute/reward/release)")
    memory_limit_mb: int = Field(1024, ge=128, le=1_048_576, description="address-space limit of a worker (RLIMIT_AS)")
    allow_network: bool = Field(False, description="let this tool use the network (else an empty network namespace)")
    max_result_bytes: int = Field(
        1_048_576, ge=1024, le=1 << 28, description="largest reply a call may send; bigger ones become an error observation"
    )
    start_timeout_s: float = Field(60.0, gt=0, le=3600, description="deadline for a worker to import the tool")
    sandbox: bool = Field(
        True,
        description="run the tool in sandboxed worker processes (the default). false = call the class inside the "
        "replica process, on its event loop: no isolation, no memory limit, no network cut, and no deadline "
        "(a call that hangs stalls the replica); only for trusted tools that answer in microseconds, such as "
        "the built-in calculator",
    )


class MultiTurnConfig(StrictModel):
    """Agentic rollouts: the model talks to tools over several turns (verl's ``multi_turn``)."""

    enable: bool = Field(False, description="generate multi-turn trajectories with tool calls instead of single completions")
    max_assistant_turns: int | None = Field(
        None, ge=1, le=1000, description="most model turns per trajectory (None = until the token budget)"
    )
    max_user_turns: int | None = Field(
        None, ge=1, le=1000, description="most tool/environment observations per trajectory (None = no limit)"
    )
    max_parallel_calls: int = Field(1, ge=1, le=64, description="tool calls of one model turn that are executed")
    max_tool_response_length: int = Field(
        256, ge=1, le=1_000_000, description="characters of a tool's answer kept in the observation"
    )
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field(
        "middle", description="which part of a long tool answer is kept: left = the start, right = the end, middle = both ends"
    )
    max_tokens_per_turn: int | None = Field(
        None, ge=1, le=1_048_576, description="most tokens one model turn may generate (None = the rest of the budget)"
    )
    format: str = Field(
        "hermes",
        min_length=1,
        max_length=512,
        description="tool-call parser: hermes (<tool_call>{json}</tool_call>, Qwen's), openai (function-calling JSON), "
        "or the dotted path of a rollout_svc.agent.parsers.ToolCallParser subclass",
    )
    tool_config_path: str | None = Field(
        None, max_length=4096, description="YAML file with a `tools:` list (verl's tool config); merged with `tools`"
    )
    tools: list[ToolSpec] = Field(default_factory=list, description="tools available to every trajectory")
    tool_role: str = Field("tool", min_length=1, max_length=64, description="chat role of observation messages")
    tool_error_prefix: str = Field(
        "error: ", max_length=256, description="text before the message of a failed tool call in its observation"
    )

    @model_validator(mode="after")
    def _check(self) -> "MultiTurnConfig":
        if self.enable and not self.tools and not self.tool_config_path:
            raise ValueError("multi_turn.enable needs at least one tool (set multi_turn.tools or multi_turn.tool_config_path)")
        return self

    def resolve_paths(self, base) -> None:
        """``tool_config_path`` relative to the job spec's directory (``base``) made absolute."""
        self.tool_config_path = resolve_path(self.tool_config_path, base)

    def all_tools(self) -> list[ToolSpec]:
        """``tools`` plus those of ``tool_config_path`` (read now; raises ValueError naming the file)."""
        tools = list(self.tools)
        if self.tool_config_path:
            import yaml

            try:
                with open(self.tool_config_path) as fh:
                    raw = yaml.safe_load(fh) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise ValueError(f"multi_turn.tool_config_path: cannot read {self.tool_config_path}: {exc}") from exc
            items = raw.get("tools") if isinstance(raw, dict) else None
            if not isinstance(items, list):
                raise ValueError(f"multi_turn.tool_config_path: {self.tool_config_path} has no `tools:` list")
            for i, item in enumerate(items):
                try:
                    tools.append(ToolSpec.model_validate(item))
                except ValueError as exc:
                    raise ValueError(f"multi_turn.tool_config_path: tools[{i}]: {exc}") from exc
        return tools
