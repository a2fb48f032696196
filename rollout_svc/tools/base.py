"""The interface of a tool (or environment) that a trajectory talks to.

A user subclasses :class:`Tool` in their own module and names it by dotted path in the job
spec (``rollout.multi_turn.tools[].class_name``). The class is imported and run only
inside sandboxed worker processes (:mod:`rollout_svc.tools.worker`), never in the rollout
service. One instance of the class serves many trajectories at once: per-trajectory state
is keyed by ``instance_id``.

Lifecycle per trajectory (as verl's ``BaseTool``)::

    create(instance_id, **create_kwargs)              # the first time the trajectory calls it
    execute(instance_id, arguments, **execute_kwargs) # every call the model makes
    reward(instance_id, **calc_reward_kwargs)         # once, when the trajectory ends
    release(instance_id, **release_kwargs)            # always, last

``create_kwargs`` etc. come from the dataset row's ``extra_info.tools_kwargs[<tool name>]``.
``execute`` returns the observation text, or a dict ``{"text": str, "reward": float,
"metrics": {...}}``. Whatever it raises becomes an error observation for the model; a call
that passes its deadline kills the worker (a fresh one takes over). ``reward`` returns a
float (the environment's own reward for the trajectory) or None.
"""

from __future__ import annotations

from typing import Any


class Tool:
    """Base class of user tools and environments (see the module docstring).

    Class attributes: ``schema``, the OpenAI function-tool schema
    ``{"type": "function", "function": {"name", "description", "parameters"}}`` (the
    job spec's ``tool_schema`` overrides it). ``self.config`` holds the spec's ``config``.
    """

    schema: dict[str, Any] = {}

    def __init__(self, config: dict[str, Any] | None = None, schema: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        if schema:
            self.schema = schema

    @property
    def name(self) -> str:
        fn = self.schema.get("function", {}) if isinstance(self.schema, dict) else {}
        return str(fn.get("name") or type(self).__name__)

    def create(self, instance_id: str, **create_kwargs: Any) -> None:
        """Set up per-trajectory state (default: nothing)."""

    def execute(self, instance_id: str, arguments: dict[str, Any], **execute_kwargs: Any) -> str | dict[str, Any]:
        """Run one call; return the observation text (or ``{"text", "reward", "metrics"}``)."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    def reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float | None:
        """The environment's reward for this trajectory, or None (default)."""
        return None

    def release(self, instance_id: str, **release_kwargs: Any) -> None:
        """Drop per-trajectory state (default: nothing)."""
