"""The LoRA half of ``bench/weights_e2e.py --lora-rank R`` (a helper of that benchmark, not a
benchmark itself).

On one model (``--model DIR``, or the first of ``--sizes`` built by weights_e2e) it runs, in
the same invocation and with weights_e2e's own code (``run_size``: the trainer's
``WeightPublisher``, real ``python -m rollout_svc`` replicas on vLLM CPU, the clock from
``publish()`` until a replica answers a ``Generate`` with the new ``policy_version``; first
round dropped, median of the rest):

1. full weights: every version is the model's own weights (a replica without LoRA);
2. LoRA: replicas started with the job's LoRA keys (``model.lora_rank``, ``lora_alpha``,
   ``target_modules`` in their config: ``rollout_svc/lora.py`` serves the adapter), every
   version the adapter's tensors as the trainer publishes them: the model wrapped by
   ``trainer_svc.lora.apply_lora`` and read out by ``iter_adapter_tensors`` (PEFT's saved
   names), with ``lora_B`` drawn at random (seeded, finite, non-zero) so a version really
   changes what the replica serves.

The adapter case is checked to serve something else than the base model: the first greedy
token's log-prob (or the token) of the last request differs from the full-weight case's,
which serves the base weights; a run where it does not is an error, not a figure.
It also prints what one ``Generate`` takes on each replica with no update going on (timed
before the rounds), the floor under both end-to-end figures, and the LoRA replica's output
before any version (its zero adapter: the base model's).

Last line: ``weights_e2e lora_rank=R full_bytes=B lora_bytes=b bytes_ratio=b/B full_e2e_s=S
lora_e2e_s=s latency_ratio=S/s`` (at the largest replica count; bytes as they go on the wire).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

IDLE_REQUESTS = 5
"""Generates timed on each replica before its rounds: the floor under every end-to-end figure
(an update is only seen served once a request has come back)."""

B_STD = 0.02
"""Standard deviation of the random ``lora_B`` entries: with PEFT's ``lora_A`` init and alpha/rank
= 2 the update is a few percent of a SmolLM2 weight's size, enough to move every log-prob."""


def targets_of(value: str) -> str | list[str]:
    return value if value == "all-linear" else [t.strip() for t in value.split(",") if t.strip()]


def adapter_tensors(model_dir: Path, rank: int, alpha: float, targets: str | list[str], dtype: str = "float32",
                    seed: int = 0) -> list[tuple[str, "torch.Tensor"]]:  # noqa: F821
    """The adapter a trainer with these LoRA keys publishes: ``(PEFT saved name, tensor)``, fresh
    tensors (the base model they hang on is dropped), ``lora_B`` random instead of zero."""
    import torch

    from services.config.job import ModelConfig
    from trainer_svc.fsdp import load_causal_lm
    from trainer_svc.lora import apply_lora, iter_adapter_tensors

    torch.manual_seed(seed)
    mcfg = ModelConfig(path=str(model_dir), dtype=dtype, lora_rank=rank, lora_alpha=alpha, target_modules=targets)
    model = apply_lora(load_causal_lm(str(model_dir), dtype), mcfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, B_STD)
    out = [(name, t.clone()) for name, t in iter_adapter_tensors(model)]
    del model
    bad = [n for n, t in out if not bool(torch.isfinite(t).all())]
    zero_b = [n for n, t in out if ".lora_B." in n and not bool(t.any())]
    if not out or bad or zero_b:
        raise RuntimeError(f"adapter tensors: {len(out)} tensors, non-finite {bad[:3]}, all-zero lora_B {zero_b[:3]}")
    return out


def run_lora(args: argparse.Namespace, e2e: ModuleType) -> int:
    """Full weights, then the adapter, on the same model; prints the LoRA contract line."""
    import sys

    counts = sorted(int(c) for c in args.replicas.split(","))
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.model:
        model_dir, name = Path(args.model), e2e.model_name(args.model)
        if not (model_dir / "config.json").is_file():
            print(f"--model: {model_dir} is not a Hugging Face model directory (no config.json)", file=sys.stderr)
            return 2
    else:
        name = args.sizes.split(",")[0].strip()
        if name not in e2e.SIZES:
            print(f"--sizes: unknown {name!r} (choose from {sorted(e2e.SIZES)})", file=sys.stderr)
            return 2
        model_dir = e2e.build_model(name, workdir)
    targets = targets_of(args.target_modules)
    keys = {"lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha, "target_modules": targets}
    from services import auth

    auth.provision_temporary()  # this run is a job of its own: publisher and replicas share it
    print(f"weights_e2e: model {model_dir}, full weights then LoRA rank {args.lora_rank} alpha {args.lora_alpha:g} "
          f"targets {targets}, replicas {counts}, {args.rounds} rounds (first dropped), bucket {args.bucket_mb:g} MiB, "
          f"serving {args.dtype}", flush=True)

    full = e2e.run_size(name, args, counts, 0, model_dir=str(model_dir), idle_requests=IDLE_REQUESTS)
    print(e2e.size_line(f"case=full model={name}", full), flush=True)
    adapter = adapter_tensors(model_dir, args.lora_rank, args.lora_alpha, targets, dtype=args.dtype)
    lora = e2e.run_size(f"{name}-lora{args.lora_rank}", args, counts, full["version"], model_dir=str(model_dir),
                        tensors=adapter, model_keys=keys, idle_requests=IDLE_REQUESTS)
    print(e2e.size_line(f"case=lora model={name} rank={args.lora_rank} tensors={len(adapter)}", lora), flush=True)

    f, lo = full["runs"][counts[-1]], lora["runs"][counts[-1]]
    base, served = f["served"][0], lo["served"][0]
    print(f"served first token (id, log-prob): full weights (the base model) {base}, LoRA replica before any version "
          f"(its zero adapter) {lo['idle_output']}, after the LoRA versions {served}", flush=True)
    print(f"one Generate with no update going on (median of {IDLE_REQUESTS}, before the rounds): full-weight replica "
          f"{f['idle_request_s']:.3f}s, LoRA replica {lo['idle_request_s']:.3f}s", flush=True)
    if base is None or served is None or (base[0] == served[0] and abs(base[1] - served[1]) < 1e-4):
        print("the LoRA replica served the base model's output: the adapter version did not take effect",
              file=sys.stderr)
        return 1
    print(f"weights_e2e lora_rank={args.lora_rank} full_bytes={f['bytes']} lora_bytes={lo['bytes']} "
          f"bytes_ratio={lo['bytes'] / f['bytes']:.4f} full_e2e_s={f['e2e_s']:.3f} lora_e2e_s={lo['e2e_s']:.3f} "
          f"latency_ratio={f['e2e_s'] / lo['e2e_s']:.2f}")
    return 0
