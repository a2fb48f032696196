"""A reward model as a scorer: a HuggingFace sequence-classification checkpoint, in batches.

verl's ``reward_model.enable`` path: the prompt and the response are decoded to text,
re-tokenized with the reward model's own tokenizer (so the policy and the reward model
may use different vocabularies), and scored in micro-batches; the score of a sample is
the model's ``logits[:, 0]`` (a single-label head). The checkpoint is loaded with
``trust_remote_code=False`` from local safetensors only.
"""

from __future__ import annotations

from typing import Any

import torch


class RewardModelScorer:
    """Scores ``prompt + response`` texts with a sequence-classification model on CPU/GPU."""

    def __init__(self, path: str, *, micro_batch_size: int = 16, max_length: int = 2048, device: str = "cpu") -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=False, use_safetensors=True)
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.max_length = max_length

    @torch.no_grad()
    def score(self, texts: list[str]) -> list[float]:
        """One float per text: ``logits[:, 0]`` at the last non-padding token."""
        out: list[float] = []
        for i in range(0, len(texts), self.micro_batch_size):
            enc: Any = self.tokenizer(
                texts[i : i + self.micro_batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            ).to(self.device)
            logits = self.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
            out.extend(logits[:, 0].float().cpu().tolist())
        return out
