"""``meshrl export SRC OUT``: a trainer checkpoint as a Hugging Face model directory.

SRC is a run directory (its newest checkpoint), a checkpoint directory (holding
``latest_checkpointed_iteration.txt``) or one ``global_step_<N>`` directory. OUT receives
``config.json``, the tokenizer and ``model.safetensors``: ``transformers`` loads it and
vLLM serves it (``vllm serve OUT``). A LoRA run (``model.lora_rank > 0``) exports its PEFT
adapter directory (``adapter_config.json``, ``adapter_model.safetensors``), or with
``--merged`` the base model with the adapter merged in.
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
    p.add_argument("--merged", action="store_true",
                   help="LoRA runs: merge the adapter into the base model and write a plain Hugging Face model "
                        "(default for LoRA: the PEFT adapter directory)")


def run(args: argparse.Namespace) -> int:
    from trainer_svc.hf_export import export_hf

    out = export_hf(args.src, args.out, model_dir=args.model, dtype=args.dtype, overwrite=args.overwrite,
                    merged=args.merged)
    if (out / "adapter_config.json").is_file():
        print(f"exported the LoRA adapter to {out} (load with peft.PeftModel.from_pretrained over the base model, "
              "serve with vllm --enable-lora; --merged writes a whole model)")
    else:
        print(f"exported to {out} (load with transformers.AutoModelForCausalLM.from_pretrained, serve with vllm)")
    return 0
