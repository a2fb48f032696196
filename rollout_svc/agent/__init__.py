"""Agentic rollouts: multi-turn trajectories with tool calls (docs/agent.md).

:mod:`.parsers` finds tool calls in a model turn, :mod:`.loop` runs one trajectory per
sample as its own asyncio task on the replica's engine, :mod:`.trajectory` holds a
trajectory and packs a group of them into verl's layout (``response_mask`` 0 on
observation tokens).
"""
