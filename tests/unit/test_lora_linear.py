"""The trainer's fused LoRA linear layer (``trainer_svc/lora_linear.py``) against PEFT's own:
the same parameters and saved names, the same outputs and the same gradients (adapter and
input), with the adapter on, off (the reference policy) and under no-grad; on the tiny
Qwen2-style model (q/k/v carry a bias) and on single layers of other shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainer_svc.lora import apply_lora, iter_adapter_tensors
from trainer_svc.lora_linear import _LoraLinearFn, fused_lora_linear_class

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _pair(tiny_model: str, *, checkpointing: bool = False, rank: int = 8):
    """The tiny model with PEFT's LoRA layers and with the fused ones, the same random adapter."""
    from trainer_svc.fsdp import load_causal_lm

    mcfg = SimpleNamespace(path=tiny_model, lora_rank=rank, lora_alpha=16, target_modules="all-linear",
                           lora_adapter_path=None)
    out = []
    for fused in (False, True):
        torch.manual_seed(0)
        model = load_causal_lm(tiny_model)
        if checkpointing:
            model.gradient_checkpointing_enable()
        out.append(apply_lora(model, mcfg, fused=fused))
    g = torch.Generator().manual_seed(1)
    for a, b in zip(*(m.named_parameters() for m in out), strict=True):
        assert a[0] == b[0]
        if ".lora_" in a[0]:  # lora_B starts at zero: make the adapter do something
            with torch.no_grad():
                a[1].copy_(torch.randn(a[1].shape, generator=g) * 0.05)
                b[1].copy_(a[1])
    out[0].train(), out[1].train()
    return out


def _inputs(vocab: int) -> dict:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as the trainer's batches have it
    return {"input_ids": ids, "attention_mask": mask}


def test_only_peft_linear_layers_switch_and_names_stay(tiny_model):
    from peft.tuners.lora.layer import Linear

    peft_model, fused = _pair(tiny_model)
    cls = fused_lora_linear_class()
    kinds = {type(m) for m in fused.modules() if isinstance(m, Linear)}
    assert kinds == {cls} and issubclass(cls, Linear)
    assert not any(type(m) is cls for m in peft_model.modules())
    assert list(fused.state_dict()) == list(peft_model.state_dict())
    assert [n for n, _ in iter_adapter_tensors(fused)] == [n for n, _ in iter_adapter_tensors(peft_model)]
    assert [n for n, p in fused.named_parameters() if p.requires_grad] == \
        [n for n, p in peft_model.named_parameters() if p.requires_grad]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_forward_and_gradients_match_peft(tiny_model, checkpointing):
    peft_model, fused = _pair(tiny_model, checkpointing=checkpointing)
    inputs = _inputs(peft_model.config.vocab_size)
    logits = []
    for m in (peft_model, fused):
        out = m(**inputs).logits
        logits.append(out)
        (out.float().log_softmax(-1)[..., :7].sum() * 0.01).backward()
    torch.testing.assert_close(logits[1], logits[0], **TOL)
    grads = [{n: p.grad for n, p in m.named_parameters() if p.requires_grad} for m in (peft_model, fused)]
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        assert grads[0][n] is not None and grads[1][n] is not None, n
        torch.testing.assert_close(grads[1][n], grads[0][n], **TOL, msg=lambda s, n=n: f"{n}: {s}")
    assert all(p.grad is None for n, p in fused.named_parameters() if not p.requires_grad)


def test_no_grad_and_disabled_adapter_match_peft(tiny_model):
    peft_model, fused = _pair(tiny_model)
    inputs = _inputs(peft_model.config.vocab_size)
    with torch.no_grad():
        on = [m(**inputs).logits for m in (peft_model, fused)]
        off = []
        for m in (peft_model, fused):
            with m.disable_adapter():
                off.append(m(**inputs).logits)
    torch.testing.assert_close(on[1], on[0], **TOL)
    assert torch.equal(off[1], off[0])  # the adapter off: PEFT's path, the base alone
    assert not torch.allclose(on[1], off[1])  # and the adapter does change the output


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5, 24), (2, 7, 24), (1, 3, 4, 24)])
def test_function_matches_the_unfused_expression(shape, bias):
    g = torch.Generator().manual_seed(3)
    out_f, r, s = 40, 4, 2.5
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(out_f, shape[-1], generator=g, dtype=torch.float64)
    b = torch.randn(out_f, generator=g, dtype=torch.float64, requires_grad=True) if bias else None
    a = torch.randn(r, shape[-1], generator=g, dtype=torch.float64, requires_grad=True)
    lb = torch.randn(out_f, r, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.linear(x, w, b) + torch.nn.functional.linear(torch.nn.functional.linear(x, a), lb) * s
    got = _LoraLinearFn.apply(x, w, b, a, lb, s)
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref)
    leaves = [t for t in (x, b, a, lb) if t is not None]
    gout = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    want = torch.autograd.grad(ref, leaves, gout)
    have = torch.autograd.grad(got, leaves, gout)
    for h, wnt in zip(have, want, strict=True):
        torch.testing.assert_close(h, wnt)
    assert torch.autograd.gradcheck(lambda x, a, lb: _LoraLinearFn.apply(x, w, b, a, lb, s), (x, a, lb))
