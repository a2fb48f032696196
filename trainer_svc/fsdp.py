"""FSDP2 plumbing: process group, device mesh, sharding, optimizer, full-parameter gather.

One code path for CPU (gloo) and GPU (nccl): only the backend name and the device differ.
Every collective inherits the process group's timeout (``init_process_group(timeout=...)``),
so a dead peer raises instead of hanging.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from services.config.trainer import MixedPrecisionConfig, OptimConfig


@dataclass
class DistContext:
    """This rank's place in the data-parallel group.

    ``group`` carries the model collectives (gloo on CPU, nccl on GPU); ``cpu_group`` is a
    gloo group over the same ranks for host-side traffic (batch frames, flags).
    """

    rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh
    group: dist.ProcessGroup
    cpu_group: dist.ProcessGroup
    timeout: datetime.timedelta


def init_distributed(device: str = "cpu", timeout_s: float = 300.0) -> DistContext:
    """Join the process group described by the torchrun environment variables.

    ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` must be set (torchrun, or
    :mod:`trainer_svc.launch`). Every collective on the returned groups times out after
    ``timeout_s`` seconds.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        from services.net import tcp_store

        # The rendezvous listens on MASTER_ADDR only (torch's default store listens everywhere).
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = tcp_store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout_s,
                          is_master=rank == 0, world_size=world)
        dist.init_process_group(backend=backend, timeout=timeout, store=store, rank=rank, world_size=world)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",))
    group = mesh.get_group("dp")
    cpu_group = group if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return DistContext(rank, world, dev, mesh, group, cpu_group, timeout)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a HuggingFace decoder-only model (``model.model.layers``;
    under a PEFT LoRA wrapper, those of the model it wraps)."""
    if callable(getattr(type(model), "get_base_model", None)):  # a PeftModel (trainer_svc/lora.py)
        model = model.get_base_model()
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers; cannot wrap decoder layers for FSDP2")
    return list(layers)


def shard_model(
    model: torch.nn.Module, mesh: DeviceMesh, *, reshard_after_forward: bool = True,
    mixed_precision: MixedPrecisionConfig | None = None,
) -> torch.nn.Module:
    """Apply FSDP2 ``fully_shard`` to every decoder layer, then to the root (in place).

    Parameters become ``DTensor``s sharded on dim 0 across ``mesh``; each layer's
    parameters are all-gathered just before its forward and freed after. With
    ``mixed_precision`` the gathered copies are cast to its ``param_dtype`` (the sharded
    master parameters, their gradients and the optimizer state keep the model's dtype) and
    gradients are reduce-scattered in its ``reduce_dtype``; the model's outputs stay in
    ``param_dtype`` (log-probs are taken in float32 by the actor).

    On a mesh of one rank without mixed precision the model is returned unwrapped: there
    is nothing to shard, and FSDP2 would only add its hooks around every layer's forward and
    backward, DTensor dispatch on every optimizer and clipping op, and a one-rank
    reduce-scatter per layer -- about an eighth of a quick-start trainer step -- for the
    same numbers (one rank's all-gather and reduce-scatter are copies). With mixed precision
    it is wrapped even then: FSDP2 is what casts.
    """
    if mesh.size() == 1 and mixed_precision is None:
        return model
    kw: dict = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mixed_precision is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=getattr(torch, mixed_precision.param_dtype),
            reduce_dtype=getattr(torch, mixed_precision.reduce_dtype),
        )
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def load_causal_lm(path: str, dtype: str = "float32", *, device: torch.device | str = "cpu") -> torch.nn.Module:
    """Load a HuggingFace causal LM (the policy / reference) from a local directory."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per rank is noise in the service log
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa")
    model.config.use_cache = False
    return model.to(device)


def load_value_model(path: str, dtype: str = "float32", *, device: torch.device | str = "cpu") -> torch.nn.Module:
    """Load a HuggingFace token-classification model with one output (the critic's value head)."""
    from transformers import AutoModelForTokenClassification

    torch_dtype = getattr(torch, dtype)
    model = AutoModelForTokenClassification.from_pretrained(
        path, num_labels=1, dtype=torch_dtype, attn_implementation="sdpa"
    )
    model.config.use_cache = False
    return model.to(device)


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters plus a warmup(+cosine) ``LambdaLR``.

    ``total_steps`` counts optimizer steps (mini-batches x epochs x training steps).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    kw = dict(lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)
    try:
        # The fused kernel (CPU and CUDA) steps FSDP2's DTensor parameters about 4x faster
        # than foreach here: one dispatch per parameter instead of one per op and parameter.
        opt = torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        opt = torch.optim.AdamW(params, foreach=True, **kw)
    warmup = cfg.lr_warmup_steps if cfg.lr_warmup_steps >= 0 else int(cfg.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.warmup_style == "cosine":
            span = max(1, total_steps - warmup)
            progress = min(1.0, (step - warmup) / span)
            return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global gradient L2 norm of a (possibly FSDP2-sharded) model; returns the
    pre-clip norm as a plain scalar tensor (``inf``/``nan`` when gradients are not finite)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm.detach().float().cpu()


def iter_full_params(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, full tensor)`` for every parameter and buffer, one at a time.

    Collective: every rank must drain the iterator in the same order (each sharded
    ``DTensor`` is all-gathered with ``full_tensor()``), so peak extra memory is one
    parameter. Names are HuggingFace's (``model.layers.0.self_attn.q_proj.weight``).
    """
    for name, p in model.named_parameters():
        t = p.detach()
        if isinstance(t, DTensor):
            t = t.full_tensor()
        yield name, t
    for name, b in model.named_buffers():
        if "rotary_emb" in name:  # derived, not loaded from checkpoints
            continue
        b = b.detach()
        if isinstance(b, DTensor):
            b = b.full_tensor()
        yield name, b


def _local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    """This rank's storage of every parameter: the local shard of a ``DTensor`` (FSDP2's
    sharded parameter, a view into its flat storage), the tensor itself otherwise."""
    return [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]


def _reshard(model: torch.nn.Module) -> None:
    """Free FSDP2's gathered parameters (kept after a forward with ``reshard_after_forward``
    off): the next forward gathers again, from the shards as they are now."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


@dataclass
class ShardCopy:
    """A copy of this rank's parameter shards at policy ``version`` (local, no collective):
    what the canary gate judges a candidate with after the trainer has stepped past it.
    Kept in host memory (pinned on a GPU), so a GPU trainer's device memory does not grow:
    swapping it in and out copies each shard across and back once."""

    version: int
    tensors: list[torch.Tensor]

    @classmethod
    def of(cls, model: torch.nn.Module, version: int) -> "ShardCopy":
        with torch.no_grad():
            out = []
            for t in _local_shards(model):
                host = t.detach().to("cpu", copy=True)
                out.append(host.pin_memory() if t.is_cuda else host)
            return cls(version, out)


@contextmanager
def swapped_params(model: torch.nn.Module, copy: ShardCopy) -> Iterator[None]:
    """Run the body with ``copy``'s parameters in ``model`` (forward only), then put the
    model's own back. The contents are swapped in place, one tensor at a time, so the extra
    memory is one parameter shard (on the host) and ``copy`` holds its own values again
    afterwards.
    Every rank must enter it around the same collectives (the forward's all-gathers)."""
    shards = _local_shards(model)
    if len(shards) != len(copy.tensors):
        raise ValueError(f"the shard copy has {len(copy.tensors)} tensors, the model {len(shards)}")

    def swap() -> None:
        with torch.no_grad():
            for mine, theirs in zip(shards, copy.tensors):
                tmp = mine.detach().to(theirs.device, copy=True)
                mine.detach().copy_(theirs)
                theirs.copy_(tmp)

    _reshard(model)
    swap()
    try:
        yield
    finally:
        _reshard(model)
        swap()


def set_torch_threads(threads: int, nproc: int) -> int:
    """Give each rank a fair share of the CPUs it may run on (``threads``=0 means that many
    // nproc: its affinity, so ``services.trainer.cpus`` and a container's cpuset count)."""
    from services.placement import available_cpus

    n = threads or max(1, len(available_cpus()) // max(1, nproc))
    torch.set_num_threads(n)
    return n
