"""What the LoRA replica tests share: a prompt item, a chat prompt's ids, the log-prob gap
between a reference model and what a replica sampled, and a bounded wait."""

from __future__ import annotations

import time

import numpy as np
import torch


def item(prompt: list[int], uid: str, n: int = 4, validate: bool = False):
    """One prompt item as the feeder puts it on ``prompts`` (``n`` samples)."""
    from services.protocol import DataProto

    ids = np.empty(1, dtype=object)
    ids[0] = prompt
    return DataProto.from_dict(
        non_tensors={"raw_prompt_ids": ids, "uid": np.array([uid], dtype=object),
                     "sample_id": np.array([uid], dtype=object), "data_source": np.array(["meshrl/arith"], dtype=object),
                     "reward_model": np.array([{"style": "rule", "ground_truth": "1"}], dtype=object)},
        meta_info={"validate": validate, "epoch": 0, "n": n})


def prompt_ids(tiny_model: str, text: str) -> list[int]:
    """``text`` as a user turn in the model's chat template, tokenized."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                                   return_dict=False)


def log_prob_gap(model, out) -> tuple[float, float]:
    """Mean and max |log p_model - log p_replica| over the sampled tokens of a group."""
    from trainer_svc.actor import forward_log_probs

    b = out.batch
    with torch.no_grad():
        _, lp = forward_log_probs(model, {k: b[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")},
                                  1.0, False)
    m = b["response_mask"].bool()
    d = (lp - b["rollout_log_probs"].float()).abs()[m]
    return float(d.mean()), float(d.max())


def wait_for(pred, what: str, timeout: float) -> None:
    """Poll ``pred`` until true; AssertionError naming ``what`` past ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
