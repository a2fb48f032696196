"""Helpers shared by the reward tests: a locally trained tokenizer and rollouts groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from services.protocol import DataProto


def write_tokenizer(out_dir: Path) -> str:
    """Train the tiny byte-level BPE tokenizer (no model weights) into ``out_dir``; return its dir."""
    from services.modelling.tiny import TinyModelSpec, build_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(TinyModelSpec()).save(str(out_dir / "tokenizer.json"))
    return str(out_dir)


def make_group(
    tokenizer_dir: str,
    texts: list[str],
    truths: list[object],
    data_source: str | list[str] = "openai/gsm8k",
    *,
    prompt_len: int = 4,
    resp_len: int = 32,
    uid: str = "g0",
    extra: dict[str, np.ndarray] | None = None,
) -> DataProto:
    """A verl-layout rollouts group: left-padded prompts, right-padded responses ending in EOS."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    pad = tok.token_to_id("<|endoftext|>")
    b = len(texts)
    responses = torch.full((b, resp_len), pad, dtype=torch.int64)
    attn = torch.zeros((b, prompt_len + resp_len), dtype=torch.int64)
    attn[:, prompt_len - 2 :prompt_len] = 1  # a 2-token prompt, left padded
    for i, t in enumerate(texts):
        ids = (tok.encode(t).ids + [eos])[:resp_len]
        responses[i, : len(ids)] = torch.tensor(ids)
        attn[i, prompt_len : prompt_len + len(ids)] = 1
    prompts = torch.full((b, prompt_len), pad, dtype=torch.int64)
    sources = [data_source] * b if isinstance(data_source, str) else list(data_source)
    nt = {
        "data_source": np.array(sources, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": g} for g in truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(b)], dtype=object),
        "uid": np.array([uid] * b, dtype=object),
        "sample_id": np.array([f"{uid}/{i}" for i in range(b)], dtype=object),
        "error": np.array([""] * b, dtype=object),
    }
    nt.update(extra or {})
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": attn[:, prompt_len:].clone(),
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attn,
        },
        non_tensors=nt,
        meta_info={"group": uid},
    )


def last_valid_index(group: DataProto) -> list[int]:
    """Index of the last attended response token of each sample."""
    r = group.batch["responses"].shape[1]
    return [int(row.nonzero().max()) for row in group.batch["attention_mask"][:, -r:]]
