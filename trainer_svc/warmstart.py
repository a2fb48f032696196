"""A short supervised warm start (SFT) on a verl-style prompt dataset.

RL from a randomly initialised model would spend most of its budget discovering the
answer *format*. The quick start therefore runs a few hundred supervised steps on
(prompt, ground truth) pairs first, stops early — well before the task is solved — and
leaves the rest to RL. The loss is cross-entropy on the answer tokens and the
end-of-turn token only (the prompt is context, as in verl's SFT trainer).

    meshrl warm-start MODEL_DIR DATA.parquet OUT_DIR --steps 200

Single process, plain PyTorch + transformers: the same code runs on CPU and GPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from services.data.prompts import apply_template


@dataclass
class WarmStartResult:
    steps: int
    final_loss: float
    p_correct: float  # mean probability of sampling exactly the right answer (T=1): the expected reward
    out_dir: Path


def _examples(rows, tokenizer, max_len: int, chat_template: str | None = None) -> list[tuple[list[int], int]]:
    """(token ids of prompt+answer+eos, number of prompt tokens) per row."""
    out = []
    eos = tokenizer.eos_token_id
    for r in rows:
        p = apply_template(tokenizer, r["prompt"], chat_template)
        # a worked solution, where the task has one, else the bare answer
        answer = (r.get("extra_info") or {}).get("solution") or r["reward_model"]["ground_truth"]
        a = tokenizer.encode(str(answer), add_special_tokens=False)
        ids = list(p) + list(a) + [eos]
        if len(ids) <= max_len:
            out.append((ids, len(p)))
    if not out:
        raise ValueError(f"no example fits in {max_len} tokens")
    return out


def _batch(examples, pad: int, labels_from_prompt: bool = True):
    import torch

    width = max(len(ids) for ids, _ in examples)
    n = len(examples)
    input_ids = torch.full((n, width), pad, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attn[i, : len(ids)] = 1
        labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
    return input_ids, attn, labels


def expected_exact_match(model, examples, pad: int, device: str = "cpu", batch_size: int = 128) -> float:
    """Mean over examples of p(answer tokens + eos | prompt) at temperature 1: the reward an
    exact-match scorer gives a sampled response, in expectation."""
    import torch

    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            input_ids, attn, labels = _batch(chunk, pad)
            logits = model(input_ids=input_ids.to(device), attention_mask=attn.to(device)).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            tgt = labels[:, 1:].to(device)
            mask = tgt != -100
            tok_lp = logp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
            total += float(tok_lp.sum(-1).exp().sum())
    model.train()
    return total / len(examples)


def warm_start(model_dir: str | Path, data_files, out_dir: str | Path, *, steps: int = 200,
               batch_size: int = 32, lr: float = 2e-3, seed: int = 0, max_len: int = 64,
               device: str = "cpu", log_every: int = 50, chat_template: str | None = None,
               examples: list[tuple[list[int], int]] | None = None,
               stop_when: Callable[[Any, int], bool] | None = None, check_every: int = 5) -> WarmStartResult:
    """Supervised steps on ``data_files`` (prompt -> ground truth), or on ``examples``
    (``(token ids, number of context tokens without a loss)`` each, e.g. the turns of tool-use
    transcripts) when given; returns the saved model's :class:`WarmStartResult`.

    ``stop_when(model, step)``, called every ``check_every`` steps, ends the warm start early
    when it returns true (e.g. once a held-out expected reward reaches a target): ``steps``
    is then the cap."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.data.files import read_rows
    from services.data.prompts import resolve_chat_template

    torch.manual_seed(seed)
    rng = random.Random(seed)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars: noise in a run log
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    model.train()
    if examples is None:
        examples = _examples(read_rows(data_files), tok, max_len, resolve_chat_template(chat_template))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    loss_val = float("nan")
    done = 0
    for step in range(1, steps + 1):
        batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
        input_ids, attn, labels = _batch(batch, pad)
        out = model(input_ids=input_ids.to(device), attention_mask=attn.to(device), labels=labels.to(device))
        if not torch.isfinite(out.loss):
            raise FloatingPointError(f"warm start: non-finite loss at step {step}")
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = float(out.loss.detach())
        done = step
        if log_every and step % log_every == 0:
            print(f"warm start step {step}/{steps} loss={loss_val:.4f}", flush=True)
        if stop_when is not None and step % check_every == 0:
            stopped = bool(stop_when(model, step))
            model.train()
            if stopped:
                break
    p_correct = expected_exact_match(model, examples[:512], pad, device)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    gen = Path(model_dir) / "generation_config.json"
    if gen.exists() and not (out_dir / "generation_config.json").exists():
        (out_dir / "generation_config.json").write_text(gen.read_text())
    return WarmStartResult(steps=done, final_loss=loss_val, p_correct=p_correct, out_dir=out_dir)
