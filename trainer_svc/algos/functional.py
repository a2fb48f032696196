"""Masked tensor reductions, loss aggregation and KL estimators with verl's semantics.

Conventions used throughout: ``B`` is the number of responses in the (micro-)batch, ``T``
the padded response length. Loss matrices and masks are ``[B, T]``; masks are 0/1 in any
dtype (bool, int or float). Reductions return 0-dim tensors of the loss dtype.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = [
    "AGG_LOSS_MODES",
    "KL_PENALTY_TYPES",
    "UnknownKLPenaltyError",
    "agg_loss",
    "clip_by_value",
    "entropy_from_logits",
    "kl_penalty",
    "kl_penalty_forward",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

#: Valid ``loss_agg_mode`` values of :func:`agg_loss`.
AGG_LOSS_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

#: Valid base names of :func:`kl_penalty` (each may carry a trailing ``+``; ``full`` is
#: accepted by name but, as in verl, not implemented).
KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")

Number = Union[int, float, torch.Tensor]


class UnknownKLPenaltyError(ValueError, NotImplementedError):
    """An unknown ``kl_penalty`` type. Catchable as ``ValueError`` and, like verl, as
    ``NotImplementedError``."""


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero; NaN/inf outside the mask are ignored.

    Args:
        values: any shape.
        mask: same shape as ``values`` (bool or numeric 0/1).
        axis: dimension to reduce, or ``None`` for all.
    """
    valid = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return (valid * mask).sum(dim=axis) if axis is not None else (valid * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Mean over masked elements: ``masked_sum / (mask.sum() + 1e-8)`` (verl's form; an
    all-zero mask gives 0, not NaN)."""
    count = mask.sum(dim=axis) if axis is not None else mask.sum()
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements (Bessel-corrected when ``unbiased``).

    Raises:
        ValueError: if fewer than two elements are unmasked and ``unbiased`` is set
            (verl raises on these too: the correction would divide by zero).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count == 0:
            raise ValueError("masked_var: the mask selects no element (need at least two)")
        if count == 1:
            raise ValueError("masked_var: the mask selects a single element; the unbiased variance is undefined")
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with masked mean and unbiased masked variance
    over all unmasked elements of the batch; with ``shift_mean=False`` the mean is added back.
    Output has the shape of ``values``; masked-out positions are not zeroed (callers multiply
    by the mask, as verl's estimators do)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp with tensor bounds: ``max(min(x, tensor_max), tensor_min)``."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy per position: ``logsumexp(l) - sum(softmax(l) * l)``.

    Args:
        logits: ``[..., V]``. Returns ``[...]``.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def _safe_divide(numerator: torch.Tensor, denominator: Number) -> torch.Tensor:
    """``numerator / denominator``, or ``numerator * 0`` (keeping the autograd graph) when the
    denominator is zero — an all-masked batch yields a zero loss instead of NaN."""
    denom = torch.as_tensor(denominator, dtype=numerator.dtype, device=numerator.device)
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    return torch.where(denom == 0, numerator * 0.0, numerator / safe)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar, as verl's current ``agg_loss``.

    The global-batch arguments make the result invariant to how a batch is split across
    data-parallel ranks and micro-batches: each rank passes its micro-batch with the
    *global* counts and ``dp_size``, so that averaging gradients over ranks (FSDP) and
    summing over micro-batches reproduces the single-process loss. Left at their defaults,
    every mode reduces to its simple single-batch form.

    Modes (``L`` = loss_mat, ``M`` = loss_mask, ``S_i = sum_t L_it M_it``):
        ``token-mean``: ``sum_it L M / batch_num_tokens * dp_size``
            (default ``batch_num_tokens = M.sum()``);
        ``token-sum``: ``sum_it L M * dp_size`` (no normalisation);
        ``seq-mean-token-sum``: ``sum_i S_i / global_batch_size * dp_size`` over sequences
            with at least one unmasked token (default ``global_batch_size`` = their count);
        ``seq-mean-token-mean``: same, with ``S_i / (sum_t M_it + 1e-8)``;
        ``seq-mean-token-sum-norm`` (Dr.GRPO): ``seq-mean-token-sum`` divided by
            ``loss_scale_factor`` (default: the padded length ``T``).

    Args:
        loss_mat: ``[B, T]`` float.
        loss_mask: ``[B, T]`` 0/1.
        loss_agg_mode: one of :data:`AGG_LOSS_MODES`.
        dp_size: data-parallel world size (the loss is scaled up by it to cancel FSDP's mean).
        batch_num_tokens: valid tokens in the global batch (required when ``dp_size > 1``
            for ``token-mean``).
        global_batch_size: valid sequences in the global batch (required when
            ``dp_size > 1`` for the ``seq-mean-*`` modes).
        loss_scale_factor: constant normaliser of ``seq-mean-token-sum-norm``.

    Returns:
        0-dim tensor. If the denominator is zero (an all-masked batch) the result is ``0``
        with the graph intact — verl would return NaN there.

    Raises:
        ValueError: unknown mode, mismatched shapes, or missing global counts with
            ``dp_size > 1``.
    """
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"agg_loss: loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ")
    # counts come from the mask in its own dtype (exact for bool/int masks even when the
    # loss is bf16); products use a mask in the loss dtype
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss: batch_num_tokens (global) is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return _safe_divide(masked_sum(loss_mat, mask), batch_num_tokens) * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens_per_seq = loss_mask.sum(dim=-1)
        seq_losses = (torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat)) * mask).sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (tokens_per_seq + 1e-8)
        seq_mask = (tokens_per_seq > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("agg_loss: global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = _safe_divide(masked_sum(seq_losses, seq_mask), global_batch_size) * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    raise ValueError(f"agg_loss: invalid loss_agg_mode {loss_agg_mode!r}; expected one of {AGG_LOSS_MODES}")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (no ``+`` handling).

    With ``d = logprob - ref_logprob``:
        ``kl``/``k1``: ``d``; ``abs``: ``|d|``; ``mse``/``k2``: ``d**2 / 2``;
        ``low_var_kl``/``k3``: ``exp(-d) + d - 1`` with ``-d`` clamped to [-20, 20] and the
        result clamped to [-10, 10] (Schulman's k3, as verl clamps it).

    Raises:
        NotImplementedError: for ``full`` — verl names it (a KL over the full vocabulary,
            which needs logits, not log-probs of the sampled tokens) but does not implement it.
        UnknownKLPenaltyError: any other name.
    """
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError(
            "kl_penalty 'full' needs the full-vocabulary distributions; verl's kl_penalty does not implement it "
            "either. Use 'low_var_kl' (k3), 'kl' (k1) or 'mse' (k2), optionally with a '+' suffix."
        )
    raise UnknownKLPenaltyError(
        f"unknown kl_penalty {kl_penalty!r}; expected one of {KL_PENALTY_TYPES}, optionally suffixed with '+'"
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of type ``kl_penalty`` (see :func:`kl_penalty_forward`).

    A trailing ``+`` (e.g. ``"k3+"``, ``"low_var_kl+"``, ``"k1+"``) selects the
    straight-through variant: the forward value is the named estimator, the gradient is the
    k2 gradient ``d`` (unbiased for the KL gradient). ``"k2+"``/``"mse+"`` equal ``k2``.
    """
    base = kl_penalty[:-1] if kl_penalty.endswith("+") else kl_penalty
    forward_score = kl_penalty_forward(logprob, ref_logprob, base)
    if not kl_penalty.endswith("+") or base in ("mse", "k2"):
        return forward_score
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()
