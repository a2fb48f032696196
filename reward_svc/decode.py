"""Turn response token ids into text, in batches, the way verl's reward manager does.

:func:`load_decoder` accepts a tokenizer directory holding ``tokenizer.json`` (or the file
itself) and uses the Rust ``tokenizers`` library directly (``decode_batch`` runs on all
cores, no Python per token); any other directory falls back to
``transformers.AutoTokenizer`` (``batch_decode``). :func:`response_lengths` computes each
sample's valid response length from the batch's masks; :func:`final_turn_spans` where
each sample's last model turn lies (multi-turn trajectories, docs/agent.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class Decoder(Protocol):
    """Anything that turns lists of token ids into strings."""

    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]: ...


class _FastDecoder:
    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(path)

    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._tok.decode_batch(ids, skip_special_tokens=skip_special_tokens)


class _HFDecoder:
    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path)

    def decode_batch(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return self._tok.batch_decode(ids, skip_special_tokens=skip_special_tokens)


def load_decoder(path: str) -> Decoder:
    """A :class:`Decoder` for a tokenizer directory or ``tokenizer.json`` file."""
    if os.path.isfile(path):
        return _FastDecoder(path)
    fast = os.path.join(path, "tokenizer.json")
    if os.path.isfile(fast):
        return _FastDecoder(fast)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path!r} does not exist")
    return _HFDecoder(path)


def response_lengths(batch: Any) -> torch.Tensor:
    """Valid response length per sample, int64 ``[B]``.

    The response occupies the last ``R = responses.shape[-1]`` columns of
    ``attention_mask`` (verl's layout: left-padded prompt, right-padded response); the
    valid length is one past the last attended response position. Without an
    ``attention_mask``, ``response_mask`` is used the same way; without either, ``R``.
    """
    responses = batch["responses"]
    r = responses.shape[-1]
    keys = batch.keys()
    if "attention_mask" in keys:
        mask = batch["attention_mask"][:, -r:]
    elif "response_mask" in keys:
        mask = batch["response_mask"]
    else:
        return torch.full((responses.shape[0],), r, dtype=torch.int64)
    if mask.shape != responses.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not cover responses {tuple(responses.shape)}")
    nz = mask != 0
    pos = torch.arange(1, r + 1, dtype=torch.int64).expand_as(nz)
    return torch.where(nz, pos, torch.zeros_like(pos)).amax(dim=-1) if r else torch.zeros(responses.shape[0], dtype=torch.int64)


def valid_id_lists(responses: torch.Tensor, lengths: torch.Tensor) -> list[list[int]]:
    """Each row of ``responses`` cut to its valid length, as Python int lists."""
    arr = responses.numpy() if responses.device.type == "cpu" else responses.cpu().numpy()
    lens = lengths.tolist()
    return [arr[i, :n].tolist() for i, n in enumerate(lens)]


def final_turn_spans(batch: Any, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, end)`` of each sample's last model turn in its response, int64 ``[B]`` each.

    A multi-turn response interleaves model turns (``response_mask`` 1) and observations
    (``response_mask`` 0, attended). The last model turn is the run of ``response_mask`` 1
    that ends at the last model token before ``lengths`` (``end`` is one past it); it
    starts one past the last 0 before that token. Without a ``response_mask`` (or when it
    is 1 on every valid token, as for single-turn samples) that is ``(0, lengths)``: the
    whole response. A sample with no model token gets the empty span ``(lengths, lengths)``.
    """
    responses = batch["responses"]
    b, r = responses.shape
    lengths = lengths.to(torch.int64)
    if "response_mask" not in batch.keys() or r == 0:
        return torch.zeros(b, dtype=torch.int64), lengths.clone()
    mask = batch["response_mask"]
    if mask.shape != responses.shape:
        raise ValueError(f"response_mask shape {tuple(mask.shape)} does not cover responses {tuple(responses.shape)}")
    pos = torch.arange(r, dtype=torch.int64).expand(b, r)
    valid = pos < lengths.unsqueeze(-1)
    model = (mask != 0) & valid
    none = torch.full_like(pos, -1)
    last_model = torch.where(model, pos, none).amax(dim=-1)  # -1: no model token
    gap = (~model) & valid & (pos < last_model.unsqueeze(-1))
    start = torch.where(gap, pos, none).amax(dim=-1) + 1
    empty = last_model < 0
    return torch.where(empty, lengths, start), torch.where(empty, lengths, last_model + 1)
