"""verl generate_sequences layout of one packed group (no vLLM needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollout_svc.packing import LOGPROB_PAD, Sample, pack_group
from services import wire

PAD, EOS = 0, 2


def _pack(samples, **kw):
    n = len(samples)
    cols = {"uid": np.array(["u"] * n, dtype=object)}
    return pack_group(
        samples, prompt_length=6, response_length=5, pad_token_id=PAD, eos_token_ids=[EOS],
        non_tensors=cols, sample_ids=[f"u/{k}" for k in range(n)], meta_info={"validate": False}, **kw,
    )


def test_left_pad_prompts_right_pad_responses() -> None:
    out = _pack([
        Sample(prompt_ids=[7, 8, 9], response_ids=[11, 12, EOS], log_probs=[-0.1, -0.2, -0.3], policy_version=3),
        Sample(prompt_ids=[5, 6, 7, 8, 9, 10], response_ids=[13, 14, 15, 16, 17], log_probs=[-1.0] * 5, policy_version=4,
               finish_reason="length"),
    ])
    b = out.batch
    assert b["prompts"].tolist() == [[PAD, PAD, PAD, 7, 8, 9], [5, 6, 7, 8, 9, 10]]
    assert b["responses"].tolist() == [[11, 12, EOS, PAD, PAD], [13, 14, 15, 16, 17]]
    assert b["response_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], 1))
    assert b["attention_mask"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0], [1] * 11]
    assert b["position_ids"].tolist() == [[0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7], list(range(11))]
    assert b["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, -0.3, LOGPROB_PAD, LOGPROB_PAD])
    assert b["policy_version"].tolist() == [3, 4]
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "policy_version"):
        assert b[k].dtype == torch.int64, k
    assert b["rollout_log_probs"].dtype == torch.float32
    assert out.non_tensor_batch["sample_id"].tolist() == ["u/0", "u/1"]
    assert out.non_tensor_batch["error"].tolist() == ["", ""]
    assert out.non_tensor_batch["finish_reason"].tolist() == ["stop", "length"]


def test_mask_stops_after_first_eos() -> None:
    out = _pack([Sample(prompt_ids=[4], response_ids=[9, EOS, 9, EOS], log_probs=[-1.0] * 4)])
    assert out.batch["response_mask"].tolist() == [[1, 1, 0, 0, 0]]


def test_error_sample_is_empty_and_masked() -> None:
    out = _pack([Sample(prompt_ids=[], error="empty prompt", finish_reason="error", policy_version=1)])
    b = out.batch
    assert b["attention_mask"].sum() == 0 and b["response_mask"].sum() == 0
    assert (b["prompts"] == PAD).all() and (b["responses"] == PAD).all()
    assert out.non_tensor_batch["error"].tolist() == ["empty prompt"]


def test_rejects_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="exceeds prompt_length"):
        _pack([Sample(prompt_ids=list(range(7)), response_ids=[1])])
    with pytest.raises(ValueError, match="exceed response_length"):
        _pack([Sample(prompt_ids=[1], response_ids=list(range(6)))])
    with pytest.raises(ValueError, match="log-probs"):
        _pack([Sample(prompt_ids=[1], response_ids=[3, 4], log_probs=[-1.0])])


def test_packed_group_survives_the_wire_and_concat() -> None:
    from services.protocol import DataProto

    a = _pack([Sample(prompt_ids=[1, 2], response_ids=[3, EOS], log_probs=[-1.0, -2.0])])
    b = _pack([Sample(prompt_ids=[1], response_ids=[3], log_probs=[-1.0])])
    back = wire.decode(wire.encode(DataProto.concat([a, b])))
    assert len(back) == 2
    assert torch.equal(back.batch["responses"], torch.cat([a.batch["responses"], b.batch["responses"]]))
    assert back.non_tensor_batch["sample_id"].tolist() == ["u/0", "u/0"]
