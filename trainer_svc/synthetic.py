"""Deterministic synthetic experience groups, shaped like the ``experience`` stream's items.

For tests, benchmarks and smoke runs of the trainer without rollout/reward services. One
group = one prompt sampled ``n`` times: left-padded prompt, right-padded response, a 0/1
outcome reward on the last valid response token, ``rollout_log_probs``,
``policy_version`` and the non-tensor ``uid`` / ``sample_id`` columns.
"""

from __future__ import annotations

import torch

from services.protocol import DataProto


def make_group(
    uid: str,
    *,
    n: int,
    prompt_len: int,
    response_len: int,
    vocab_size: int,
    seed: int,
    policy_version: int = 0,
    min_prompt: int | None = None,
    min_response: int | None = None,
) -> DataProto:
    """One experience group of ``n`` samples (see module docstring).

    Shapes: ``input_ids``/``attention_mask``/``position_ids`` int64 ``[n, P+R]``,
    ``prompts`` ``[n, P]``, ``responses``/``response_mask`` ``[n, R]``,
    ``token_level_scores``/``rollout_log_probs`` float32 ``[n, R]``, ``policy_version`` int64 ``[n]``.
    """
    g = torch.Generator().manual_seed(seed)
    lo_p = min_prompt or max(1, prompt_len // 2)
    lo_r = min_response or max(1, response_len // 2)
    p_valid = int(torch.randint(lo_p, prompt_len + 1, (1,), generator=g))
    prompt = torch.zeros(prompt_len, dtype=torch.long)
    prompt[prompt_len - p_valid :] = torch.randint(3, vocab_size, (p_valid,), generator=g)
    prompts = prompt.unsqueeze(0).repeat(n, 1)
    responses = torch.zeros(n, response_len, dtype=torch.long)
    response_mask = torch.zeros(n, response_len, dtype=torch.long)
    scores = torch.zeros(n, response_len, dtype=torch.float32)
    for i in range(n):
        r_valid = int(torch.randint(lo_r, response_len + 1, (1,), generator=g))
        responses[i, :r_valid] = torch.randint(3, vocab_size, (r_valid,), generator=g)
        response_mask[i, :r_valid] = 1
        scores[i, r_valid - 1] = float(torch.randint(0, 2, (1,), generator=g))
    prompt_mask = (prompts != 0).long()
    prompt_mask[:, prompt_len - p_valid :] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    input_ids = torch.cat([prompts, responses], dim=1)
    rollout_lp = -torch.rand(n, response_len, generator=g) * 3 * response_mask
    import numpy as np

    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "token_level_scores": scores,
            "rollout_log_probs": rollout_lp,
            "policy_version": torch.full((n,), policy_version, dtype=torch.long),
        },
        non_tensors={
            "uid": np.array([uid] * n, dtype=object),
            "sample_id": np.array([f"{uid}/{k}" for k in range(n)], dtype=object),
        },
    )


def make_batch(
    groups: int, *, n: int, prompt_len: int, response_len: int, vocab_size: int, seed: int = 0, policy_version: int = 0
) -> DataProto:
    """``groups`` groups concatenated (uids ``g{seed}-{i}``)."""
    parts = [
        make_group(
            f"g{seed}-{i}",
            n=n,
            prompt_len=prompt_len,
            response_len=response_len,
            vocab_size=vocab_size,
            seed=seed * 100_003 + i,
            policy_version=policy_version,
        )
        for i in range(groups)
    ]
    return DataProto.concat(parts)
