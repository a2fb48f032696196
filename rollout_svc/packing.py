"""Pack generated samples into verl's ``generate_sequences`` output layout.

One prompt group (``n`` samples of one prompt) becomes one ``DataProto`` of batch size ``n``:

======================  ====================================  =========  =================================
field                   shape                                 dtype      meaning
======================  ====================================  =========  =================================
``prompts``             ``[n, prompt_length]``                int64      prompt ids, LEFT-padded with pad
``responses``           ``[n, response_length]``              int64      generated ids, RIGHT-padded with pad
``response_mask``       ``[n, response_length]``              int64      1 = generated token (eos included)
``input_ids``           ``[n, prompt_length+response_length]`` int64     ``cat(prompts, responses)``
``attention_mask``      ``[n, prompt_length+response_length]`` int64     0 on padding, 1 elsewhere
``position_ids``        ``[n, prompt_length+response_length]`` int64     0.. over real prompt tokens, then
                                                                         continuing through the response
``rollout_log_probs``   ``[n, response_length]``              float32    log p(token) at sampling; -1 on pad
``policy_version``      ``[n]``                               int64      oldest policy version used
======================  ====================================  =========  =================================

Non-tensor columns: the prompt item's columns repeated per sample, ``sample_id``
(``f"{uid}/{k}"``), ``error`` (``""`` when fine, else why the sample is empty) and
``finish_reason`` (``"stop"`` / ``"length"`` / ``"abort"`` / ``"error"``). As in verl, the
response part of ``attention_mask`` is 1 up to and including the first eos and 0 after;
a sample with an error has all-pad prompt and response and zero masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: verl pads rollout log-probs with -1 (``pad_2d_list_to_length(..., -1, ...)``)
LOGPROB_PAD = -1.0


@dataclass
class Sample:
    """One generated sample before packing.

    ``prompt_ids`` is the unpadded prompt; ``response_ids`` the generated ids (eos included
    when generation stopped on it); ``log_probs`` has one float per response id (or is
    empty when log-probs were not requested); ``error`` is non-empty for a failed sample.
    """

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    policy_version: int = 0
    finish_reason: str = "stop"
    error: str = ""


def _response_attention(responses: torch.Tensor, lengths: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """1 for response positions < length and up to (incl.) the first eos; 0 after. ``[n, R]`` int64."""
    n, r = responses.shape
    pos = torch.arange(r).unsqueeze(0).expand(n, r)
    valid = pos < lengths.unsqueeze(1)
    if eos_ids:
        is_eos = torch.zeros_like(responses, dtype=torch.bool)
        for e in eos_ids:
            is_eos |= responses == e
        is_eos &= valid
        # positions strictly after the first eos are masked out
        after = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0
        valid &= ~after
    return valid.long()


def pack_group(
    samples: Sequence[Sample],
    *,
    prompt_length: int,
    response_length: int,
    pad_token_id: int,
    eos_token_ids: Sequence[int],
    non_tensors: dict[str, np.ndarray] | None = None,
    sample_ids: Sequence[str],
    meta_info: dict[str, Any] | None = None,
):
    """Build the output ``DataProto`` of one group (see the module docstring for the layout).

    ``non_tensors`` maps column name -> object array of length ``len(samples)`` (already
    repeated per sample). Prompts longer than ``prompt_length`` or responses longer than
    ``response_length`` must have been rejected/truncated by the caller (ValueError here).
    """
    from services.protocol import DataProto

    n = len(samples)
    if n == 0:
        raise ValueError("pack_group needs at least one sample")
    if len(sample_ids) != n:
        raise ValueError(f"{len(sample_ids)} sample_ids for {n} samples")
    prompts = torch.full((n, prompt_length), pad_token_id, dtype=torch.int64)
    prompt_mask = torch.zeros((n, prompt_length), dtype=torch.int64)
    responses = torch.full((n, response_length), pad_token_id, dtype=torch.int64)
    logp = torch.full((n, response_length), LOGPROB_PAD, dtype=torch.float32)
    lengths = torch.zeros(n, dtype=torch.int64)
    versions = torch.zeros(n, dtype=torch.int64)
    for i, s in enumerate(samples):
        versions[i] = s.policy_version
        if s.error:
            continue
        p, r = len(s.prompt_ids), len(s.response_ids)
        if p > prompt_length:
            raise ValueError(f"sample {sample_ids[i]}: prompt of {p} tokens exceeds prompt_length {prompt_length}")
        if r > response_length:
            raise ValueError(f"sample {sample_ids[i]}: {r} response tokens exceed response_length {response_length}")
        if p:
            prompts[i, prompt_length - p :] = torch.tensor(s.prompt_ids, dtype=torch.int64)
            prompt_mask[i, prompt_length - p :] = 1
        if r:
            responses[i, :r] = torch.tensor(s.response_ids, dtype=torch.int64)
            if s.log_probs:
                if len(s.log_probs) != r:
                    raise ValueError(f"sample {sample_ids[i]}: {len(s.log_probs)} log-probs for {r} tokens")
                logp[i, :r] = torch.tensor(s.log_probs, dtype=torch.float32)
        lengths[i] = r
    response_mask = _response_attention(responses, lengths, eos_token_ids)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    prompt_pos = torch.clamp(torch.cumsum(prompt_mask, dim=1) - 1, min=0)
    delta = torch.arange(1, response_length + 1, dtype=torch.int64).unsqueeze(0)
    response_pos = prompt_pos[:, -1:] + delta
    position_ids = torch.cat([prompt_pos, response_pos], dim=1)
    # keep pad ids where the mask is 0 after an eos (vLLM never generates past eos, but a
    # stop-token id could appear mid-response; verl keeps the ids and masks them)
    cols = dict(non_tensors or {})
    cols["sample_id"] = np.array(list(sample_ids), dtype=object)
    cols["error"] = np.array([s.error for s in samples], dtype=object)
    cols["finish_reason"] = np.array([s.finish_reason for s in samples], dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "rollout_log_probs": logp,
            "policy_version": versions,
        },
        non_tensors=cols,
        meta_info=dict(meta_info or {}),
    )
