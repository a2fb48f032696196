"""Helpers for the Hugging Face model directories meshrl's tools write (tiny, GGUF)."""

from __future__ import annotations

import json
from pathlib import Path


def embed_chat_template(model_dir: str | Path, template: str) -> None:
    """Put ``template`` into ``tokenizer_config.json`` as well.

    Newer readers take ``chat_template.jinja`` (written by ``save_pretrained``); older ones
    (and some servers) look only inside ``tokenizer_config.json``. Keep both in step.
    """
    path = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template
    path.write_text(json.dumps(config, indent=2))


def count_parameters(model_dir: str | Path) -> int:
    """Number of stored parameters (elements) in ``model_dir``'s safetensors files."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shape = h.get_slice(k).get_shape()
                n = 1
                for s in shape:
                    n *= s
                total += n
    return total
