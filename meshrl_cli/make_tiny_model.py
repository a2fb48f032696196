"""``meshrl make-tiny-model OUT_DIR``: write the tiny Qwen2-style test model (no downloads)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_dir", help="directory to write the HuggingFace model into")
    p.add_argument("--hidden-size", type=int, default=128, help="hidden size (default 128)")
    p.add_argument("--layers", type=int, default=2, help="number of decoder layers (default 2)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4; head_dim = hidden/heads)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    p.add_argument("--intermediate-size", type=int, default=384, help="MLP width (default 384)")
    p.add_argument("--seed", type=int, default=0, help="weight init seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from services.modelling.hf_dir import count_parameters
    from services.modelling.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        seed=args.seed,
    )
    out = build_tiny_model(args.out_dir, spec)
    print(f"wrote tiny model to {out} ({count_parameters(out)} parameters)")
    return 0
