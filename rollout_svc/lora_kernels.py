"""vLLM's CPU LoRA operations, one matrix product per adapter slot instead of per token.

vLLM's CPU build applies LoRA layers with its PyTorch reference operations
(``vllm.lora.ops.torch_ops``): each gathers one copy of the adapter matrix *per token*
(``weights[indices]``: tokens x out x rank) and contracts it with ``einsum``. Measured here
(one thread, 2,048 tokens, 576 -> rank 16): 0.26 s for the shrink against 1.3 ms for the
same product as one matmul, 0.49 s for the expand to 1,536. On the SmolLM2 LoRA example the
step-0 validation (296 samples) took 219 s against 35 s without an adapter, and generation
ran at 16-30 tokens/s.

The functions below compute the same thing by adapter slot: the tokens that use slot ``s``
go through one product with slot ``s``'s matrix (a job's replica has one slot, so a batch is
one product; a batch mixing several adapters costs one product per adapter in it). Each
keeps its reference operation's signature and writes its output the same way; where the
shapes are not the ones it knows (an index per token), it calls the reference operation.

One difference on purpose: a token whose index is -1 (vLLM's "no LoRA for this request",
``PunicaWrapperBase.token_lora_indices``) gets no adapter here. The reference operations
index the weights with it as Python does, so such a token got the *last* slot's adapter: on
an engine serving several jobs' adapters, a request without one would have been served
another job's adapter.

:func:`install` puts them in place of the reference operations in the process that runs the
model (the worker calls it when it sets up LoRA, :meth:`MeshWorkerExtension.meshrl_lora_setup`).
GPU workers are not affected: vLLM's GPU path uses its Triton kernels, not these.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

#: The reference operations replaced by :func:`install`, by name (kept for the fallback).
_REFERENCE: dict[str, Callable[..., None]] = {}


def per_slot_product(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                     dtype: torch.dtype) -> torch.Tensor | None:
    """``inputs[t] @ weights[indices[t]].T`` for every token ``t`` (``weights``: slots x out x
    in, or slots x 1 x out x in), as one product per slot present in ``indices``, and zero for
    a token whose index is negative (no adapter); None when ``indices`` is not one index per
    row of ``inputs``."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    if indices.dim() != 1 or indices.shape[0] != inputs.shape[0] or weights.dim() != 3:
        return None
    inputs = inputs.to(dtype)
    if inputs.shape[0] == 0:
        return inputs.new_zeros((0, weights.shape[1]))
    slots = torch.unique(indices).tolist()
    if len(slots) == 1 and slots[0] >= 0:
        return inputs @ weights[slots[0]].to(dtype).T
    out = inputs.new_zeros((inputs.shape[0], weights.shape[1]))
    for slot in slots:
        if slot < 0:  # no adapter: stays zero
            continue
        rows = indices == slot
        out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    outputs = per_slot_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        return _REFERENCE["bgmv_shrink"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    outputs = per_slot_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        return _REFERENCE["bgmv_expand"](inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs)
    rows = output_tensor.shape[0]
    if outputs.shape[0] == 1 and rows != 1:  # one row for all (as the reference does)
        rows = 1
    width = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :width] += outputs[:rows, :width]
    else:
        output_tensor[:, :width] = outputs[:rows, :width]


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    outputs = per_slot_product(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if outputs is None:
        return _REFERENCE["bgmv_expand_slice"](inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                                               slice_offset, slice_size, add_inputs)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs


_REPLACEMENTS: dict[str, Callable[..., None]] = {
    "bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def install() -> bool:
    """Replace vLLM's CPU reference operations in this process (idempotent); False when this
    vLLM has no such module or names (nothing is replaced then)."""
    try:
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError as exc:
        log.warning("LoRA: vLLM's CPU LoRA operations not found (%s); left as they are", exc)
        return False
    if not all(callable(getattr(lora_ops, name, None)) for name in _REPLACEMENTS):
        log.warning("LoRA: this vLLM's CPU LoRA operations have other names; left as they are")
        return False
    for name, fn in _REPLACEMENTS.items():
        current = getattr(lora_ops, name)
        if current is not fn:
            _REFERENCE[name] = current
        # the sgmv_* (prefill) operations call these through lora_ops' globals; the wrapper
        # imported its own names
        setattr(lora_ops, name, fn)
        if hasattr(punica_cpu, name):
            setattr(punica_cpu, name, fn)
    return True
