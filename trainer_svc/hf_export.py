"""Turn a trainer checkpoint (DCP) into a Hugging Face model directory.

    export_hf("runs/my-job", "out/my-model")        # a run dir: its newest checkpoint
    export_hf("runs/my-job/checkpoints", "out/m")    # a checkpoint root (latest_checkpointed_iteration.txt)
    export_hf(".../global_step_40", "out/m")         # one checkpoint

The result is what ``transformers.AutoModelForCausalLM.from_pretrained`` loads and vLLM
serves: ``config.json`` (and ``generation_config.json``) of the starting model, its
tokenizer, and the actor's weights at that checkpoint in ``model*.safetensors``. The base
model directory (config + tokenizer) is found from the run's ``job.yaml`` /
``config/trainer.yaml`` next to the checkpoint, or given with ``model_dir``.

Runs in one process without torch.distributed: DCP reads the shards of every rank that
wrote the checkpoint and reassembles full tensors. Only the actor's model weights are
read (not the optimizer state). Exported weights are bit-equal to the trainer's
(``dtype`` may cast them, e.g. to bfloat16, for serving).
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("meshrl.export")

LATEST_FILE = "latest_checkpointed_iteration.txt"  # same name as trainer_svc.checkpoint
ACTOR_PREFIX = "actor.model."
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja")


class ExportError(ValueError):
    """The source is not a checkpoint we can export, or the base model does not match it."""


@dataclass
class Located:
    step_dir: Path  # global_step_<N>
    model_dir: Path  # base model: config.json + tokenizer
    tokenizer_dir: Path
    trust_remote_code: bool


def _latest(root: Path) -> Path:
    text = (root / LATEST_FILE).read_text().strip()
    if not text.isdigit():
        raise ExportError(f"{root / LATEST_FILE} does not hold a step number ({text!r})")
    step = root / f"global_step_{text}"
    if not (step / "state.json").exists():
        raise ExportError(f"{root / LATEST_FILE} names step {text}, but {step}/state.json is missing")
    return step


def _run_config(start: Path) -> tuple[Path | None, dict[str, Any]]:
    """The nearest run dir at or above ``start`` (holding config/trainer.yaml or job.yaml), and its spec."""
    import yaml

    for d in (start, *start.parents):
        for name in ("config/trainer.yaml", "job.yaml"):
            f = d / name
            if f.is_file():
                try:
                    return d, yaml.safe_load(f.read_text()) or {}
                except (OSError, yaml.YAMLError) as exc:
                    raise ExportError(f"{f}: cannot read it ({exc})") from None
    return None, {}


def locate(src: str | Path, model_dir: str | Path | None = None) -> Located:
    """Find the checkpoint to export under ``src`` and the base model it was trained from."""
    src = Path(src).expanduser().resolve()
    if not src.exists():
        raise ExportError(f"{src} does not exist (give a run dir, a checkpoint dir or a global_step_N dir)")
    if not src.is_dir():
        raise ExportError(f"{src} is a file; give a run dir, a checkpoint dir or a global_step_N dir")
    run_dir, raw = _run_config(src)
    if (src / "state.json").exists():
        step = src
    elif (src / LATEST_FILE).exists():
        step = _latest(src)
    else:
        ckpt = (raw.get("trainer") or {}).get("default_local_dir") or "checkpoints"
        root = Path(ckpt) if Path(ckpt).is_absolute() else src / ckpt
        if not (root / LATEST_FILE).exists():
            raise ExportError(f"{src}: no checkpoint found (looked for state.json, {LATEST_FILE} and {root}/{LATEST_FILE})")
        step = _latest(root)
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    base = model_dir or model.get("path")
    if base is None:
        raise ExportError(f"{step}: cannot tell which model it was trained from (no job.yaml or config/trainer.yaml "
                          "above it); pass --model BASE_MODEL_DIR")
    base = Path(base).expanduser()
    if not (base / "config.json").is_file():
        raise ExportError(f"base model {base} has no config.json; pass --model BASE_MODEL_DIR")
    tok = Path(model.get("tokenizer_path") or base) if model_dir is None else base
    return Located(step, base, tok, bool(model.get("trust_remote_code", False)))


def read_actor_weights(step_dir: Path) -> dict[str, Any]:
    """The actor's full weights of checkpoint ``step_dir``, by Hugging Face parameter name."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(step_dir / "model"))
    try:
        meta = reader.read_metadata()
    except (OSError, ValueError, RuntimeError) as exc:
        raise ExportError(f"{step_dir}/model: not a readable checkpoint ({exc})") from None
    tensors: dict[str, Any] = {}
    for key, md in meta.state_dict_metadata.items():
        if key.startswith(ACTOR_PREFIX) and isinstance(md, TensorStorageMetadata):
            tensors[key[len(ACTOR_PREFIX):]] = torch.empty(md.size, dtype=md.properties.dtype)
    if not tensors:
        raise ExportError(f"{step_dir}/model holds no actor weights (keys start with {ACTOR_PREFIX!r})")
    with warnings.catch_warnings():
        # loading in one process is the point here, not a misconfiguration
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load({"actor": {"model": tensors}}, storage_reader=reader, no_dist=True)
    return tensors


def export_hf(src: str | Path, out: str | Path, *, model_dir: str | Path | None = None,
              tokenizer_dir: str | Path | None = None, dtype: str | None = None, overwrite: bool = False,
              merged: bool = False) -> Path:
    """Write the HF model directory ``out`` from the checkpoint under ``src`` (see module doc).
    ``tokenizer_dir``: where the tokenizer files are, when not beside the base model's config.
    ``dtype``: cast floating weights to float32/bfloat16/float16 (default: keep the trainer's).
    A LoRA checkpoint (``model.lora_rank > 0``) becomes a PEFT adapter directory, or with
    ``merged`` the base model with the adapter merged in (a plain HF model directory)."""
    import torch
    import transformers

    found = locate(src, model_dir)
    if tokenizer_dir is not None:
        found.tokenizer_dir = Path(tokenizer_dir).expanduser()
    out = Path(out).expanduser().resolve()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out} exists and is not empty (choose another directory, or --overwrite)")
    weights = read_actor_weights(found.step_dir)
    state = json.loads((found.step_dir / "state.json").read_text())
    if state.get("lora"):
        return _export_lora(found, out, state, weights, merged=merged, dtype=dtype)
    if merged:
        raise ExportError(f"{found.step_dir} is a full fine-tuning checkpoint: --merged applies to LoRA adapters only")
    if dtype is not None:
        cast = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if cast is None:
            raise ExportError(f"dtype {dtype!r}: expected float32, bfloat16 or float16")
        weights = {k: v.to(cast) if v.is_floating_point() else v for k, v in weights.items()}
    config = transformers.AutoConfig.from_pretrained(found.model_dir, trust_remote_code=found.trust_remote_code)
    floating = [v.dtype for v in weights.values() if v.is_floating_point()]
    wdtype = floating[0] if floating else torch.float32
    hf_log = transformers.utils.logging
    verbosity = hf_log.get_verbosity()
    hf_log.set_verbosity_error()  # init-time chatter about weights we overwrite next
    hf_log.disable_progress_bar()
    try:
        with torch.device("cpu"):
            model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=found.trust_remote_code,
                                                                  dtype=wdtype)
    finally:
        hf_log.set_verbosity(verbosity)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight") and getattr(config, "tie_word_embeddings", False)}
    missing = [k for k in missing if k not in tied and "rotary_emb" not in k]
    if missing or unexpected:
        raise ExportError(f"checkpoint {found.step_dir} does not match the model in {found.model_dir}: "
                          f"missing {missing[:5]}, unexpected {list(unexpected)[:5]} (pass --model the base model)")
    model.config.dtype = wdtype
    return _write_model_dir(model, found, out, state)


def _write_model_dir(model: Any, found: Located, out: Path, state: dict, adapter: Path | None = None) -> Path:
    """``model`` saved as a Hugging Face directory ``out`` (generation config, tokenizer,
    ``meshrl_export.json``), written beside it and renamed into place. ``adapter``: a PEFT
    adapter directory to copy in instead of a model (``model`` None)."""
    import transformers

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if adapter is not None:
        shutil.copytree(adapter, tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    gen = found.model_dir / "generation_config.json"
    if gen.is_file():
        shutil.copy2(gen, tmp / "generation_config.json")
    copied = [f for f in TOKENIZER_FILES if (found.tokenizer_dir / f).is_file()]
    for f in copied:
        shutil.copy2(found.tokenizer_dir / f, tmp / f)
    if not copied:  # a tokenizer that only exists as code/remote files: let transformers write it
        tok = transformers.AutoTokenizer.from_pretrained(found.tokenizer_dir, trust_remote_code=found.trust_remote_code)
        tok.save_pretrained(tmp)
    (tmp / "meshrl_export.json").write_text(json.dumps(
        {"checkpoint": str(found.step_dir), "step": state.get("step"), "policy_version": state.get("version"),
         "base_model": str(found.model_dir), "lora": state.get("lora"),
         "contents": "peft_adapter" if adapter is not None else "model"}, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    log.info("exported %s (step %s) to %s", found.step_dir, state.get("step"), out)
    return out


def _export_lora(found: Located, out: Path, state: dict, weights: dict[str, Any], *, merged: bool,
                 dtype: str | None) -> Path:
    """A LoRA checkpoint's adapter as a PEFT directory (``adapter_config.json``,
    ``adapter_model.safetensors``, the tokenizer), or merged into the base model."""
    import tempfile

    import torch
    import transformers
    from peft import LoraConfig, PeftModel
    from safetensors.torch import save_file

    adapter = {k.replace(".default.", "."): v for k, v in weights.items() if ".lora_A." in k or ".lora_B." in k}
    if not adapter:
        raise ExportError(f"{found.step_dir}: state.json says LoRA, but the checkpoint holds no lora_A/lora_B tensors")
    lora = state["lora"]
    targets = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in adapter})
    config = LoraConfig(r=int(lora["rank"]), lora_alpha=float(lora["alpha"]), target_modules=targets,
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                        base_model_name_or_path=str(found.model_dir))
    cast = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype or "")
    with tempfile.TemporaryDirectory(prefix="meshrl-adapter-") as tmpdir:
        adir = Path(tmpdir) / "adapter"
        adir.mkdir()
        config.save_pretrained(str(adir))
        save_file({k: (v.to(cast) if cast is not None else v).contiguous() for k, v in adapter.items()},
                  str(adir / "adapter_model.safetensors"))
        if not merged:
            path = _write_model_dir(None, found, out, state, adapter=adir)
            log.info("exported the LoRA adapter of %s (step %s) to %s", found.step_dir, state.get("step"), out)
            return path
        wdtype = next(iter(adapter.values())).dtype if cast is None else cast
        hf_log = transformers.utils.logging
        hf_log.disable_progress_bar()
        base = transformers.AutoModelForCausalLM.from_pretrained(found.model_dir, dtype=wdtype,
                                                                 trust_remote_code=found.trust_remote_code)
        model = PeftModel.from_pretrained(base, str(adir), autocast_adapter_dtype=False).merge_and_unload()
        model.config.dtype = wdtype
        path = _write_model_dir(model, found, out, state)
    log.info("exported %s (step %s) with its LoRA adapter merged to %s", found.step_dir, state.get("step"), out)
    return path
