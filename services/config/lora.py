"""LoRA settings of a job (verl's ``actor_rollout_ref.model.lora_*`` keys) and their checks.

The keys live on the job's ``model:`` block, as in verl: ``model.lora_rank`` (0 = full
fine-tuning), ``model.lora_alpha``, ``model.target_modules`` (``all-linear`` or a list of
module names such as ``[q_proj, v_proj]``) and ``model.lora_adapter_path`` (start from an
existing PEFT adapter directory). This module holds what can be checked without torch:

- :func:`static_problems`: combinations that are wrong whatever the model is;
- :func:`linear_widths_from_config`: the width of every linear layer of a decoder block,
  read from the model's ``config.json`` for the architectures whose layout is known
  (Llama, Qwen2/3, Mistral families), None for others (the trainer then checks the real
  module tree at start, with the same :func:`target_problems`);
- :func:`target_problems`: unknown target modules and a rank above the smallest targeted
  layer's width, given those widths;
- :func:`lora_problems`: all of it for a job spec (``meshrl validate`` and ``meshrl run``),
  including the starting adapter's ``adapter_config.json``.

Imports only the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ALL_LINEAR = "all-linear"
#: Modules an adapter may not target here: the replicas' vLLM serves adapters on the
#: decoder's linear layers; the embeddings and the LM head are trained fully or not at all.
NOT_ADAPTABLE = ("embed_tokens", "lm_head")

#: The ranks vLLM's ``max_lora_rank`` takes; an adapter is served under the smallest one at
#: least its rank.
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: ``model_type`` values whose decoder block is the Llama layout (q/k/v/o, gate/up/down).
LLAMA_LAYOUT = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def static_problems(rank: int, alpha: float, targets: str | list[str], adapter_path: str | None) -> list[str]:
    """What is wrong with the LoRA keys on their own (one line each)."""
    out = []
    if rank > VLLM_MAX_LORA_RANKS[-1]:
        out.append(f"model.lora_rank ({rank}) exceeds {VLLM_MAX_LORA_RANKS[-1]}, the largest rank vLLM serves")
    if adapter_path and rank == 0:
        out.append("model.lora_adapter_path is set but model.lora_rank is 0 (full fine-tuning): set model.lora_rank "
                   "to the adapter's rank")
    if isinstance(targets, str):
        if targets != ALL_LINEAR:
            out.append(f"model.target_modules: {targets!r} is neither 'all-linear' nor a list of module names "
                       "(e.g. [q_proj, v_proj])")
    else:
        if not targets:
            out.append("model.target_modules: an empty list targets nothing (use all-linear or name modules)")
        bad = [t for t in targets if t in NOT_ADAPTABLE]
        if bad:
            out.append(f"model.target_modules: {bad} cannot carry an adapter here (the replicas serve adapters on "
                       "the decoder's linear layers only)")
        if len(set(targets)) != len(targets):
            out.append(f"model.target_modules: {targets} names a module twice")
    return out


def vllm_max_lora_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for an adapter of ``rank``: the smallest allowed one >= it."""
    for r in VLLM_MAX_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds {VLLM_MAX_LORA_RANKS[-1]}, the largest rank vLLM serves")


def linear_widths_from_config(config: Mapping[str, Any]) -> dict[str, tuple[int, int]] | None:
    """``{module name: (in_features, out_features)}`` of a decoder block's linear layers,
    from a ``config.json`` mapping; None for an architecture whose layout is not known here."""
    if config.get("model_type") not in LLAMA_LAYOUT:
        return None
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        inter = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    return {
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


def resolve_targets(targets: str | Iterable[str], widths: Mapping[str, tuple[int, int]]) -> list[str]:
    """The module names ``targets`` means: every linear layer of a decoder block for ``all-linear``."""
    if isinstance(targets, str):
        return sorted(widths) if targets == ALL_LINEAR else [targets]
    return list(targets)


def target_problems(rank: int, targets: str | list[str], widths: Mapping[str, tuple[int, int]],
                    where: str = "the model") -> list[str]:
    """Unknown target modules, and a rank above the smallest targeted layer's width (a
    rank-``r`` update of a layer narrower than ``r`` is no update of rank ``r``)."""
    names = resolve_targets(targets, widths)
    unknown = [t for t in names if t not in widths]
    if unknown:
        return [f"model.target_modules: {unknown} are not linear layers of {where}'s decoder blocks "
                f"(known: {', '.join(sorted(widths))})"]
    if not names:
        return []
    narrowest = min(names, key=lambda t: min(widths[t]))
    width = min(widths[narrowest])
    if rank > width:
        return [f"model.lora_rank ({rank}) exceeds the width of the smallest targeted layer ({narrowest}: "
                f"{widths[narrowest][0]} -> {widths[narrowest][1]}, width {width})"]
    return []


def read_adapter_config(path: str | Path) -> dict[str, Any]:
    """The ``adapter_config.json`` of a PEFT adapter directory (ValueError naming what is wrong)."""
    f = Path(path).expanduser() / "adapter_config.json"
    if not f.is_file():
        raise ValueError(f"model.lora_adapter_path: {path} has no adapter_config.json (not a PEFT adapter directory)")
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.lora_adapter_path: {f} cannot be read ({exc})") from None


def adapter_problems(adapter: Mapping[str, Any], rank: int, alpha: float, targets: str | list[str]) -> list[str]:
    """Where a starting adapter's own config disagrees with the job's LoRA keys."""
    out = []
    if str(adapter.get("peft_type", "LORA")).upper() != "LORA":
        out.append(f"model.lora_adapter_path: a {adapter.get('peft_type')} adapter, not LoRA")
    if int(adapter.get("r", -1)) != rank:
        out.append(f"model.lora_rank ({rank}) differs from the starting adapter's rank ({adapter.get('r')})")
    if float(adapter.get("lora_alpha", -1)) != float(alpha):
        out.append(f"model.lora_alpha ({alpha}) differs from the starting adapter's ({adapter.get('lora_alpha')})")
    theirs = adapter.get("target_modules")
    if not isinstance(targets, str) and theirs is not None and sorted(theirs) != sorted(targets):
        out.append(f"model.target_modules ({sorted(targets)}) differs from the starting adapter's ({sorted(theirs)})")
    return out


def lora_problems(spec: Any) -> list[str]:
    """Everything :func:`target_problems` and :func:`adapter_problems` find for the job spec
    ``spec`` (its ``model`` block), reading only JSON files; [] when LoRA is off."""
    m = getattr(spec, "model", None)
    if m is None or not getattr(m, "lora_rank", 0):
        return []
    out: list[str] = []
    cfg_file = Path(m.path).expanduser() / "config.json"
    if cfg_file.is_file():
        try:
            widths = linear_widths_from_config(json.loads(cfg_file.read_text()))
        except (OSError, ValueError):
            widths = None  # an unreadable config is reported by the model checks
        if widths is not None:
            out += target_problems(m.lora_rank, m.target_modules, widths, where=str(m.path))
    if m.lora_adapter_path:
        try:
            out += adapter_problems(read_adapter_config(m.lora_adapter_path), m.lora_rank, m.lora_alpha,
                                    m.target_modules)
        except ValueError as exc:
            out.append(str(exc))
    return out
