"""The trainer's LoRA linear layer: PEFT's ``lora.Linear`` with one fused forward and backward.

PEFT computes a LoRA layer as ``base(x) + lora_B(lora_A(dropout(x))) * scaling``: three
matrix products, then a multiply and an add over the whole output, and in the backward the
multiply's own backward, two linear backwards and the sum of the two gradients of ``x``.
On a CPU trainer those element-wise passes and small products, in every targeted layer of
every micro-batch, take back much of what the frozen base saves (docs/lora.md).

:class:`FusedLoraLinear` is the same module -- a subclass of PEFT's ``lora.Linear`` whose
instances keep their parameters, names, state dict, adapter switching and saving, so FSDP2
shards it and PEFT saves it as before -- with a forward that, for the plain case the trainer
uses (one active adapter, no dropout, no bias on the adapter, no DoRA or other variant, the
same dtype throughout), runs :class:`_LoraLinearFn`:

- forward: ``h = x A^T`` and ``y = x W^T (+ b)``, then ``y += scaling * h B^T`` in place by
  one ``addmm_`` (the scale is the product's ``alpha``): no multiply or add over ``y``;
- backward (``g`` the output's gradient): ``dh = scaling * g B``; ``dx = g W`` and
  ``dx += dh A`` in place; ``dA = dh^T x``; ``dB = scaling * g^T h``; the frozen base weight's
  gradient is not computed. One large and four small products, no element-wise pass over
  anything larger than the ``tokens x rank`` tensor ``dh`` and ``B``'s gradient.

Anything else (the adapter disabled, merged, several adapters, dropout, a variant, mixed
dtypes, extra arguments) goes to PEFT's own forward. :func:`fuse_lora_linears` switches the
LoRA linear layers of a PEFT model to this class in place.
"""

from __future__ import annotations

import torch

_FUSED_CLASS: type | None = None


class _LoraLinearFn(torch.autograd.Function):
    """``x W^T + b + scaling * (x A^T) B^T`` with a backward of one large and four small products."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora_a: torch.Tensor,
                lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        h = torch.mm(x2, lora_a.t())
        y = torch.mm(x2, weight.t()) if bias is None else torch.addmm(bias, x2, weight.t())
        y.addmm_(h, lora_b.t(), alpha=scaling)
        ctx.save_for_backward(x2, h, weight, lora_a, lora_b)
        ctx.scaling = scaling
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x2, h, weight, lora_a, lora_b = ctx.saved_tensors
        s = ctx.scaling
        need_x, need_w, need_b, need_a, need_lb, _ = ctx.needs_input_grad
        g = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = da = dlb = None
        dh = None
        if need_x or need_a:
            dh = torch.mm(g, lora_b)
            if s != 1.0:
                dh.mul_(s)
        if need_x:
            dx = torch.mm(g, weight)
            dx.addmm_(dh, lora_a)
            dx = dx.view(*grad.shape[:-1], weight.shape[1])
        if need_w:  # a trainable base (not the trainer's case: PEFT freezes it)
            dw = torch.mm(g.t(), x2)
        if need_b and ctx.has_bias:
            db = g.sum(0)
        if need_a:
            da = torch.mm(dh.t(), x2)
        if need_lb:
            dlb = torch.mm(g.t(), h)
            if s != 1.0:
                dlb.mul_(s)
        return dx, dw, db, da, dlb, None


def _fused_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if args or kwargs or self.disable_adapters or self.merged:
        return super(_FUSED_CLASS, self).forward(x, *args, **kwargs)
    active = self.active_adapters
    if len(active) != 1:
        return super(_FUSED_CLASS, self).forward(x, *args, **kwargs)
    name = active[0]
    base = self.base_layer
    if (name not in self.lora_A or name in self.lora_variant or self.fan_in_fan_out
            or type(base) is not torch.nn.Linear or not isinstance(self.lora_dropout[name], torch.nn.Identity)
            or self.lora_B[name].bias is not None):
        return super(_FUSED_CLASS, self).forward(x, *args, **kwargs)
    w, a, b = base.weight, self.lora_A[name].weight, self.lora_B[name].weight
    if not (x.dtype == w.dtype == a.dtype == b.dtype):
        return super(_FUSED_CLASS, self).forward(x, *args, **kwargs)
    return _LoraLinearFn.apply(x, w, base.bias, a, b, float(self.scaling[name]))


def fused_lora_linear_class() -> type:
    """PEFT's ``lora.Linear`` with the fused forward (one class, made on first use)."""
    global _FUSED_CLASS
    if _FUSED_CLASS is None:
        from peft.tuners.lora.layer import Linear

        _FUSED_CLASS = type("FusedLoraLinear", (Linear,), {"forward": _fused_forward, "__module__": __name__,
                                                           "__doc__": __doc__.split("\n\n")[0]})
    return _FUSED_CLASS


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Switch every PEFT ``lora.Linear`` of ``model`` (exactly that class, not its quantized
    relatives) to :func:`fused_lora_linear_class` in place; returns how many. Parameters,
    buffers and names are untouched."""
    from peft.tuners.lora.layer import Linear

    cls = fused_lora_linear_class()
    n = 0
    for m in model.modules():
        if type(m) is Linear:
            m.__class__ = cls
            n += 1
    return n
