"""PromptDataset: verl's ``RLHFDataset`` semantics over verl-style rows (parquet, JSON
lines, JSON or a ``datasets`` directory: :mod:`services.data.files`).

Each row's ``prompt`` (chat messages; a plain string is taken as one user message) goes
through a chat template with ``add_generation_prompt=True``: the tokenizer's own, or the
one given as ``chat_template`` (Jinja text, or the path of a ``.jinja`` file; verl users
know it as ``custom_chat_template``). Prompts longer than ``max_prompt_length`` tokens are
dropped up front when ``filter_overlong_prompts`` is on; otherwise ``truncation`` says
what happens at access time, as in verl:

    "error"   raise (the default: a silent cut changes the task)
    "left"    keep the last ``max_prompt_length`` tokens
    "right"   keep the first ``max_prompt_length`` tokens
    "middle"  keep the first half and the last half, drop the middle

An item is a plain dict:
    raw_prompt_ids  list[int]   the templated prompt's token ids, unpadded
    raw_prompt      list[dict]  the chat messages as written
    data_source     str
    reward_model    dict        {"style", "ground_truth"}
    extra_info      dict
    index           int         row number in the (filtered) dataset: the data cursor
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from services.data.files import read_rows

Truncation = Literal["error", "left", "right", "middle"]


class PromptTooLongError(ValueError):
    """A prompt exceeds ``max_prompt_length`` and ``truncation="error"``."""


def truncate_ids(ids: list[int], max_len: int, truncation: Truncation) -> list[int]:
    """Cut ``ids`` to ``max_len`` tokens the way ``truncation`` says (see module doc)."""
    if len(ids) <= max_len:
        return ids
    if truncation == "left":
        return ids[-max_len:]
    if truncation == "right":
        return ids[:max_len]
    if truncation == "middle":
        head = max_len // 2
        tail = max_len - head
        return ids[:head] + (ids[-tail:] if tail else [])
    if truncation == "error":
        raise PromptTooLongError(f"prompt length {len(ids)} is longer than max_prompt_length={max_len}")
    raise ValueError(f"unknown truncation {truncation!r}; expected error|left|right|middle")


def resolve_chat_template(value: str | None) -> str | None:
    """``None`` (the tokenizer's own), a Jinja template, or the path of a file holding one."""
    if value is None or value == "":
        return None
    if "{" not in value:  # not template text: a path
        p = Path(value).expanduser()
        if not p.is_file():
            raise ValueError(f"chat_template {value!r}: no such file (give a .jinja file or the template text)")
        return p.read_text(encoding="utf-8")
    return value


def apply_template(tokenizer: Any, messages: Any, chat_template: str | None = None) -> list[int]:
    """Token ids of ``messages`` (chat messages, or a string as one user message) with the
    generation prompt appended."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
        raise ValueError(f"prompt must be a list of chat messages with 'role'/'content', got {messages!r:.200}")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
                         "set data.chat_template (Jinja text or a .jinja file)")
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                        chat_template=chat_template)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers >= 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


class PromptDataset:
    """Tokenised prompts from one or more verl-style row files (see module doc)."""

    def __init__(
        self,
        files: str | Path | Sequence[str | Path],
        tokenizer: Any,
        *,
        max_prompt_length: int = 512,
        truncation: Truncation = "error",
        filter_overlong_prompts: bool = True,
        prompt_key: str = "prompt",
        apply_chat_template: bool = True,
        chat_template: str | None = None,
    ) -> None:
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.prompt_key = prompt_key
        self.apply_chat_template = apply_chat_template
        self.chat_template = resolve_chat_template(chat_template)
        rows = read_rows(files, required=("data_source", prompt_key, "reward_model"))
        self._ids = [self._encode(r[prompt_key]) for r in rows]
        keep = range(len(rows))
        if filter_overlong_prompts:
            keep = [i for i in keep if len(self._ids[i]) <= max_prompt_length]
        self.num_filtered = len(rows) - len(keep)
        self._rows = [rows[i] for i in keep]
        self._ids = [self._ids[i] for i in keep]

    def _encode(self, prompt: Any, tokenizer: Any = None) -> list[int]:
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if self.apply_chat_template:
            return apply_template(tokenizer, prompt, self.chat_template)
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string when apply_chat_template=False, got {type(prompt).__name__}")
        return [int(t) for t in tokenizer.encode(prompt, add_special_tokens=False)]

    def __len__(self) -> int:
        return len(self._rows)

    def differs(self, tokenizer: Any) -> str | None:
        """None when ``tokenizer`` gives every prompt kept here the ids it has here; else the
        first prompt it does not (services/data/prompt_tokenizer.py checks a tokenizer so)."""
        for i, row in enumerate(self._rows):
            mine = self._ids[i]
            ids = self._encode(row[self.prompt_key], tokenizer)
            if ids != mine:
                return f"prompt {i}: {len(ids)} ids against {len(mine)}, first difference at " \
                       f"{next((k for k, (a, b) in enumerate(zip(ids, mine)) if a != b), min(len(ids), len(mine)))}"
        return None

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self._rows[index]
        return {
            "raw_prompt_ids": truncate_ids(self._ids[index], self.max_prompt_length, self.truncation),
            "raw_prompt": row[self.prompt_key],
            "data_source": row["data_source"],
            "reward_model": row["reward_model"],
            "extra_info": row.get("extra_info") or {},
            "index": index,
        }
