"""rollout_svc.lora_kernels computes what vLLM's CPU reference LoRA operations compute."""

from __future__ import annotations

import pytest
import torch

lora_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")

from rollout_svc import lora_kernels  # noqa: E402


@pytest.fixture(scope="module")
def reference():
    """vLLM's own operations (as they are before any install in this process)."""
    return {name: lora_kernels._REFERENCE.get(name, getattr(lora_ops, name)) for name in lora_kernels._REPLACEMENTS}


def _case(indices: list[int], slots: int = 3, width_in: int = 24, width_out: int = 40, four_d: bool = True):
    g = torch.Generator().manual_seed(len(indices) * 7 + slots)
    x = torch.randn(len(indices), width_in, generator=g)
    w = torch.randn(slots, width_out, width_in, generator=g)
    return x, (w.unsqueeze(1) if four_d else w), torch.tensor(indices, dtype=torch.long)


def _no_adapter_as_zero_slot(w: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What index -1 means to vLLM ("no LoRA", ``token_lora_indices``), in terms the reference
    operations compute right: an extra all-zero slot that -1 points at."""
    return torch.cat([w, torch.zeros_like(w[:1])]), torch.where(idx < 0, w.shape[0], idx)


@pytest.mark.parametrize("indices", [[0] * 9, [0, 1, 1, 2, 0, 2, 1], [1, -1, 1, -1], [2], [-1, -1], [2, -1, 0, 1, -1]])
@pytest.mark.parametrize("four_d", [True, False])
def test_shrink_and_expand_match_the_reference(reference, indices, four_d):
    x, w, idx = _case(indices, four_d=four_d)
    rw, ridx = _no_adapter_as_zero_slot(w, idx)
    ours, theirs = torch.zeros(len(indices), 40), torch.zeros(len(indices), 40)
    lora_kernels.bgmv_shrink(x, w, ours, idx, 0.5)
    reference["bgmv_shrink"](x, rw, theirs, ridx, 0.5)
    torch.testing.assert_close(ours, theirs)
    for add in (True, False):
        base = torch.randn(len(indices), 44)  # wider than the adapter's output: the model pads
        ours, theirs = base.clone(), base.clone()
        lora_kernels.bgmv_expand(x, w, ours, idx, add)
        reference["bgmv_expand"](x, rw, theirs, ridx, add)
        torch.testing.assert_close(ours, theirs)
        ours, theirs = base.clone(), base.clone()
        lora_kernels.bgmv_expand_slice(x, w, ours, idx, 3, 40, add)
        reference["bgmv_expand_slice"](x, rw, theirs, ridx, 3, 40, add)
        torch.testing.assert_close(ours, theirs)


def test_several_adapters_in_one_batch_each_token_gets_its_own():
    """A batch mixing three slots and tokens without an adapter: each token's output is its
    own slot's product (checked token by token), the no-adapter tokens' is zero -- where
    vLLM's reference gives them the last slot's adapter."""
    indices = [2, 0, -1, 1, 1, 2, -1, 0, 0]
    x, w, idx = _case(indices, four_d=True)
    out = torch.zeros(len(indices), 40)
    lora_kernels.bgmv_shrink(x, w, out, idx, 2.0)
    for t, s in enumerate(indices):
        want = torch.zeros(40) if s < 0 else 2.0 * (w[s, 0] @ x[t])
        torch.testing.assert_close(out[t], want)
    theirs = torch.zeros(len(indices), 40)
    lora_lookup = lora_kernels._REFERENCE.get("bgmv_shrink", lora_ops.bgmv_shrink)
    lora_lookup(x, w, theirs, idx, 2.0)
    torch.testing.assert_close(theirs[2], 2.0 * (w[-1, 0] @ x[2]))  # the reference's last-slot reading of -1


def test_no_tokens_writes_nothing():
    x, w, idx = _case([])
    out = torch.zeros(0, 40)
    lora_kernels.bgmv_shrink(x, w, out, idx, 1.0)
    assert out.shape == (0, 40)


def test_install_replaces_the_operations_the_cpu_wrapper_calls(reference):
    from vllm.lora.punica_wrapper import punica_cpu

    assert lora_kernels.install() and lora_kernels.install()  # idempotent
    for name, fn in lora_kernels._REPLACEMENTS.items():
        assert getattr(lora_ops, name) is fn and getattr(punica_cpu, name) is fn
        assert lora_kernels._REFERENCE[name] is reference[name]  # the fallback is still vLLM's own
    # the prefill operation (which calls bgmv_* through lora_ops) now takes our path and agrees
    x, w, _ = _case([0] * 5 + [1] * 4)
    ours = torch.zeros(9, 40)
    lora_ops.sgmv_shrink(x, w, ours, torch.tensor([0, 5]), torch.tensor([5, 4]), torch.tensor([0, 1]), 2, 5, 9, 0.5)
    theirs = torch.zeros(9, 40)
    reference["bgmv_shrink"](x, w, theirs, torch.tensor([0] * 5 + [1] * 4), 0.5)
    torch.testing.assert_close(ours, theirs)
