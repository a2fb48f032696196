"""One multi-turn trajectory, and a group of them in verl's ``generate_sequences`` layout.

The response of a trajectory is every token after the prompt, in order: model turn 1,
observation 1 (tool/environment messages rendered by the chat template, plus the next
generation prompt), model turn 2, ... It always ends with a model turn (an observation
that would not fit the budget is dropped, as verl does), so the score the reward
service places on the last attended token lands on a model token.

Packed columns (same shapes as single-turn, :mod:`rollout_svc.packing`):

- ``responses``: all response tokens; ``attention_mask`` 1 on all of them (the model sees
  the observations as context);
- ``response_mask``: 1 on model tokens, **0 on observation tokens** and padding: losses,
  advantages, entropy and the off-policy weights of the trainer use only model tokens;
- ``rollout_log_probs``: vLLM's log p of each model token; -1 (the pad value) elsewhere;
- ``policy_version``: the oldest version any turn was generated with (staleness is that
  of the oldest turn); non-tensor ``turn_policy_versions``: the version each model turn
  started with.

Non-tensor columns added: ``num_turns`` (verl's count: assistant + user turns + 1),
``assistant_turns``, ``tool_calls``, ``tool_errors``, ``turn_policy_versions``, and
``extra_info`` per sample gains ``env_reward`` (the tools' own rewards summed, or None)
and ``tool_rewards`` (per tool name), for a reward function to use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rollout_svc.packing import LOGPROB_PAD, Sample, pack_group

#: verl's request states (the per-request state machine)
PENDING, RUNNING, TOOL_CALLING, COMPLETED = "pending", "running", "tool_calling", "completed"


@dataclass
class Trajectory(Sample):
    """A :class:`Sample` whose response interleaves model turns and observations."""

    response_mask: list[int] = field(default_factory=list)
    turn_versions: list[int] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_latency_s: float = 0.0
    tool_rewards: dict[str, float] = field(default_factory=dict)
    state: str = PENDING

    def add_model_turn(self, ids: list[int], log_probs: list[float], version: int) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([1] * len(ids))
        if log_probs:
            self.log_probs.extend(log_probs)
        else:
            self.log_probs.extend([LOGPROB_PAD] * len(ids))
        self.turn_versions.append(version)
        self.policy_version = min(self.turn_versions)
        self.assistant_turns += 1

    def add_observation(self, ids: list[int]) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([0] * len(ids))
        self.log_probs.extend([LOGPROB_PAD] * len(ids))
        self.user_turns += 1

    @property
    def env_reward(self) -> float | None:
        return float(sum(self.tool_rewards.values())) if self.tool_rewards else None


def pack_trajectories(
    trajs: Sequence[Trajectory],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    non_tensors: dict[str, np.ndarray] | None = None,
    sample_ids: Sequence[str],
    meta_info: dict[str, Any] | None = None,
):
    """One group of trajectories as a ``DataProto`` (see the module docstring)."""
    cols = dict(non_tensors or {})
    n = len(trajs)
    if "extra_info" in cols:
        extra = np.empty(n, dtype=object)
        for k, t in enumerate(trajs):
            base = cols["extra_info"][k]
            d = dict(base) if isinstance(base, dict) else {}
            d["env_reward"] = t.env_reward
            d["tool_rewards"] = dict(t.tool_rewards)
            extra[k] = d
        cols["extra_info"] = extra
    out = pack_group(trajs, prompt_length=prompt_length, response_length=response_length, pad_token_id=pad_token_id,
                     eos_token_ids=[], non_tensors=cols, sample_ids=sample_ids, meta_info=meta_info)
    mask = torch.zeros((n, response_length), dtype=torch.int64)
    for i, t in enumerate(trajs):
        if t.error:
            continue
        if len(t.response_mask) != len(t.response_ids):
            raise ValueError(f"trajectory {sample_ids[i]}: {len(t.response_mask)} mask entries for "
                             f"{len(t.response_ids)} tokens")
        if t.response_mask:
            mask[i, : len(t.response_mask)] = torch.tensor(t.response_mask, dtype=torch.int64)
    out.batch["response_mask"] = mask
    nt = out.non_tensor_batch

    def col(values):
        arr = np.empty(n, dtype=object)
        for k, v in enumerate(values):
            arr[k] = v
        return arr

    nt["num_turns"] = col([t.assistant_turns + t.user_turns + 1 for t in trajs])
    nt["assistant_turns"] = col([t.assistant_turns for t in trajs])
    nt["tool_calls"] = col([t.tool_calls for t in trajs])
    nt["tool_errors"] = col([t.tool_errors for t in trajs])
    nt["turn_policy_versions"] = col([list(t.turn_versions) for t in trajs])
    return out
