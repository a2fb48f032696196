"""``meshrl export SRC OUT``: a trainer checkpoint as a Hugging Face model directory.

SRC is a run directory (its newest checkpoint), a checkpoint directory (holding
``latest_checkpointed_iteration.txt``) or one ``global_step_<N>`` directory. OUT receives
``config.json``, the tokenizer and ``model.safetensors``: ``transformers`` loads it and
vLLM serves it (``vllm serve OUT``).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="run dir, checkpoint dir, or global_step_<N> dir")
    p.add_argument("out", help="directory to write the Hugging Face model into")
    p.add_argument("--model", default=None, help="base model dir (config + tokenizer); default: the run's model.path")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="cast the weights (default: as trained)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    from trainer_svc.hf_export import export_hf

    out = export_hf(args.src, args.out, model_dir=args.model, dtype=args.dtype, overwrite=args.overwrite)
    print(f"exported to {out} (load with transformers.AutoModelForCausalLM.from_pretrained, serve with vllm)")
    return 0
