"""LoRA on the trainer: a PEFT adapter on the policy, the base weights frozen.

With ``model.lora_rank > 0`` the trainer wraps the loaded model in a PEFT ``PeftModel``
(:func:`apply_lora`) before FSDP2 shards it: every targeted linear layer of the decoder gets
``lora_A`` / ``lora_B`` (dropout 0, no bias), the base parameters are frozen, so the
optimizer (built over the parameters that require gradients) holds only the adapter. The
reference policy is the same model with the adapter switched off (:func:`adapter_disabled`):
no second copy of the base in memory. What the trainer publishes and checkpoints is the
adapter alone (:func:`iter_adapter_tensors`), by the names PEFT saves an adapter under
(``base_model.model.<module>.lora_A.weight``), which vLLM's LoRA loader reads as they are.

A fresh adapter starts as PEFT initialises it (``lora_A`` random from the trainer's seed,
``lora_B`` zero: the policy starts as the base model); ``model.lora_adapter_path`` starts
from an existing adapter directory instead.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from services.config.lora import resolve_targets, target_problems
from trainer_svc.lora_linear import fuse_lora_linears

ADAPTER_NAME = "default"  # PEFT's name of the one adapter; left out of the saved names


class LoraSetupError(ValueError):
    """The job's LoRA keys do not fit the model (one line, naming the key)."""


def is_peft(model: torch.nn.Module) -> bool:
    return callable(getattr(type(model), "get_base_model", None))


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if is_peft(model) else model


def linear_widths(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """``{module name: (in_features, out_features)}`` of the linear layers of the decoder blocks
    (``model.model.layers``); the narrowest over the blocks for each name."""
    layers = getattr(getattr(base_model(model), "model", None), "layers", None)
    if layers is None:
        raise LoraSetupError(f"{type(model).__name__} has no .model.layers: cannot place LoRA adapters")
    out: dict[str, tuple[int, int]] = {}
    for layer in layers:
        for name, m in layer.named_modules():
            if isinstance(m, torch.nn.Linear):
                key = name.rsplit(".", 1)[-1]
                w = (m.in_features, m.out_features)
                out[key] = w if key not in out or min(w) < min(out[key]) else out[key]
    return out


def lora_config(mcfg: Any, widths: dict[str, tuple[int, int]]):
    """The ``peft.LoraConfig`` of the job's model block (``all-linear`` resolved to the
    decoder's linear layers, so the adapter's own config names them)."""
    from peft import LoraConfig

    return LoraConfig(r=mcfg.lora_rank, lora_alpha=mcfg.lora_alpha,
                      target_modules=sorted(resolve_targets(mcfg.target_modules, widths)),
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")


def apply_lora(model: torch.nn.Module, mcfg: Any, *, fused: bool = True) -> torch.nn.Module:
    """Wrap ``model`` (a loaded Hugging Face causal LM) in a PEFT LoRA adapter per the job's
    model block (``mcfg``); the base parameters are frozen. With ``fused`` (the trainer's
    choice) the LoRA linear layers run :mod:`trainer_svc.lora_linear`'s fused forward and
    backward (same parameters, names and results as PEFT's own; ``fused=False`` keeps PEFT's,
    which the benchmark and tests compare against). Raises :class:`LoraSetupError`
    when the keys do not fit the model (unknown target modules, a rank above a targeted
    layer's width)."""
    from peft import PeftModel, get_peft_model

    widths = linear_widths(model)
    problems = target_problems(mcfg.lora_rank, mcfg.target_modules, widths, where=str(mcfg.path))
    if problems:
        raise LoraSetupError("; ".join(problems))
    if mcfg.lora_adapter_path:
        from services.config.lora import adapter_problems, read_adapter_config

        problems = adapter_problems(read_adapter_config(mcfg.lora_adapter_path), mcfg.lora_rank, mcfg.lora_alpha,
                                    mcfg.target_modules)
        if problems:
            raise LoraSetupError("; ".join(problems))
        peft = PeftModel.from_pretrained(model, mcfg.lora_adapter_path, is_trainable=True,
                                         autocast_adapter_dtype=False)
    else:
        # adapters in the model's dtype (PEFT would keep them float32 under a bf16 base): FSDP2
        # shards every parameter of a layer into one buffer, and the replica serves one dtype
        peft = get_peft_model(model, lora_config(mcfg, widths), autocast_adapter_dtype=False)
    for name, p in peft.named_parameters():
        p.requires_grad_(".lora_" in name)
    if fused:
        fuse_lora_linears(peft)
    return peft


def saved_name(name: str) -> str:
    """A PEFT parameter name as PEFT saves it (``...lora_A.default.weight`` -> ``...lora_A.weight``)."""
    return name.replace(f".{ADAPTER_NAME}.", ".")


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def iter_adapter_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(saved name, full tensor)`` of every adapter parameter, one at a time. Collective
    under FSDP2 (each sharded tensor is all-gathered): every rank drains it in the same order."""
    for name, p in model.named_parameters():
        if not is_adapter_param(name):
            continue
        t = p.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        yield saved_name(name), t


def adapter_disabled(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """The base policy for the body: the adapter switched off (the reference policy)."""
    return model.disable_adapter()


def adapter_config_dict(mcfg: Any, widths: dict[str, tuple[int, int]], base_path: str | None = None) -> dict:
    """The ``adapter_config.json`` contents of the job's adapter."""
    cfg = lora_config(mcfg, widths)
    cfg.base_model_name_or_path = base_path or str(mcfg.path)
    d = cfg.to_dict()
    return json.loads(json.dumps(d, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o)))


def write_adapter(out_dir: str | Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """A PEFT adapter directory: ``adapter_config.json`` and ``adapter_model.safetensors``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    return out
