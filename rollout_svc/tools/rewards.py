"""Reward functions for trajectories whose tools give their own reward (docs/agent.md).

Use as ``reward.custom_reward_function: {path: rollout_svc.tools.rewards, name: env_reward}``.
"""

from __future__ import annotations

from typing import Any


def env_reward(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs) -> float:
    """The environment's reward of the trajectory (``extra_info["env_reward"]``; 0.0 when none)."""
    value = (extra_info or {}).get("env_reward")
    return float(value) if isinstance(value, (int, float)) else 0.0
