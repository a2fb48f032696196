"""Trainer checkpoints with ``torch.distributed.checkpoint`` (DCP).

Layout under ``trainer.default_local_dir``::

    global_step_<N>/            # one complete checkpoint (renamed into place when done)
        model/ ...              # DCP: sharded model + optimizer state (actor, critic; a LoRA actor: adapter only)
        state.json              # step, policy version, lr schedules, KL controller, intake cursor
        rng_rank<r>.pt          # torch RNG state of rank r (a uint8 tensor; loaded weights_only)
    latest_checkpointed_iteration.txt   # N of the newest complete checkpoint (verl's name)

A checkpoint is written to ``global_step_<N>.tmp`` and renamed only after every rank has
finished, so a kill mid-save leaves the previous checkpoint as the latest. Resuming
restores everything needed for the next step to be the one an uninterrupted run would
have taken: same weights, optimizer moments, lr, RNG, policy version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from trainer_svc.fsdp import DistContext

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not match this job."""


def _models(worker: Any) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer]]:
    out = {"actor": (worker.model, worker.optimizer)}
    if getattr(worker, "critic", None) is not None:
        out["critic"] = (worker.critic.module, worker.critic_optimizer)
    return out


def _lora(worker: Any) -> dict[str, Any] | None:
    """The actor's LoRA settings (rank, alpha, targets) when it trains an adapter, else None."""
    m = getattr(getattr(worker, "spec", None), "model", None)
    if m is None or not getattr(m, "lora", False):
        return None
    return {"rank": m.lora_rank, "alpha": m.lora_alpha, "target_modules": m.target_modules}


def _options(worker: Any, name: str) -> StateDictOptions | None:
    """With LoRA the actor's checkpoint holds the adapter and its optimizer state only: the
    frozen base is the starting model, loaded from ``model.path`` again on resume (so loading
    is not strict about the base's keys; a missing adapter key still fails in ``dcp.load``)."""
    return StateDictOptions(ignore_frozen_params=True, strict=False) if name == "actor" and _lora(worker) else None


def _state(worker: Any, name: str, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` of one model as DCP saves and loads it. With LoRA the
    frozen base is left out, tied aliases of it (a tied ``lm_head``, which
    ``ignore_frozen_params`` keeps: it looks only at de-duplicated names) included."""
    options = _options(worker, name)
    msd, osd = get_state_dict(model, opt, options=options)
    if options is not None:
        frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        msd = {k: v for k, v in msd.items() if k not in frozen}
    return {"model": msd, "optim": osd}


def _schedulers(worker: Any) -> dict[str, Any]:
    out = {"actor": worker.lr_scheduler}
    if getattr(worker, "critic_scheduler", None) is not None:
        out["critic"] = worker.critic_scheduler
    return out


def _sched_state(s: Any) -> dict[str, Any]:
    """The JSON-able part of an ``LambdaLR`` state (lambdas are rebuilt from the config)."""
    st = s.state_dict()
    return {k: v for k, v in st.items() if k != "lr_lambdas"}


class CheckpointManager:
    """Save / find / load checkpoints for one rank (``save`` and ``load`` are collective)."""

    def __init__(self, root: str | os.PathLike, ctx: DistContext, max_to_keep: int = 2) -> None:
        self.root = Path(root)
        self.ctx = ctx
        self.max_to_keep = max_to_keep

    def latest_step(self) -> int | None:
        """Step of the newest complete checkpoint, or ``None``."""
        f = self.root / LATEST_FILE
        if not f.exists():
            return None
        text = f.read_text().strip()
        if not text.isdigit():
            raise CheckpointError(f"{f} does not hold a step number: {text!r}")
        step = int(text)
        if not (self.root / f"global_step_{step}" / "state.json").exists():
            raise CheckpointError(f"{f} names step {step} but global_step_{step}/state.json is missing")
        return step

    def save(self, step: int, worker: Any, extra: dict[str, Any]) -> Path:
        """Write checkpoint ``step``; ``extra`` (JSON-able, e.g. the intake cursor) goes into
        ``state.json``. Collective over all ranks."""
        final = self.root / f"global_step_{step}"
        tmp = self.root / f"global_step_{step}.tmp"
        if self.ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True, exist_ok=True)
        dist.barrier(group=self.ctx.cpu_group)
        state: dict[str, Any] = {}
        for name, (model, opt) in _models(worker).items():
            state[name] = _state(worker, name, model, opt)
        dcp.save(state, checkpoint_id=str(tmp / "model"), process_group=self.ctx.cpu_group)
        torch.save(torch.get_rng_state(), tmp / f"rng_rank{self.ctx.rank}.pt")
        if self.ctx.rank == 0:
            meta = {
                "step": step,
                "version": worker.version,
                "world_size": self.ctx.world_size,
                "schedulers": {k: _sched_state(s) for k, s in _schedulers(worker).items()},
                "kl_ctrl": float(worker.kl_ctrl.value) if worker.kl_ctrl is not None else None,
                "lora": _lora(worker),
                "extra": extra,
            }
            (tmp / "state.json").write_text(json.dumps(meta, indent=1))
        dist.barrier(group=self.ctx.cpu_group)
        if self.ctx.rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            latest_tmp = self.root / (LATEST_FILE + ".tmp")
            latest_tmp.write_text(str(step))
            os.replace(latest_tmp, self.root / LATEST_FILE)
            self._prune(step)
        dist.barrier(group=self.ctx.cpu_group)
        logger.info("checkpoint saved: %s (version %d)", final, worker.version)
        return final

    def _prune(self, newest: int) -> None:
        steps = sorted(
            int(p.name.split("_")[-1])
            for p in self.root.glob("global_step_*")
            if p.is_dir() and p.name.split("_")[-1].isdigit()
        )
        for s in steps[: max(0, len(steps) - self.max_to_keep)]:
            if s != newest:
                shutil.rmtree(self.root / f"global_step_{s}", ignore_errors=True)

    def load(self, step: int, worker: Any) -> dict[str, Any]:
        """Restore checkpoint ``step`` into ``worker`` (weights, optimizer, lr, RNG, version,
        KL coefficient). Returns the saved ``extra`` dict. Collective."""
        path = self.root / f"global_step_{step}"
        meta = json.loads((path / "state.json").read_text())
        if meta["world_size"] != self.ctx.world_size:
            logger.warning(
                "checkpoint written by %d ranks, loading into %d (DCP reshards; RNG of rank 0 reused)",
                meta["world_size"], self.ctx.world_size,
            )
        if meta.get("lora") != _lora(worker):
            raise CheckpointError(f"checkpoint {path} was written with LoRA {meta.get('lora')}, this job has "
                                  f"{_lora(worker)} (model.lora_*): resume with the same adapter settings, or "
                                  "start elsewhere (trainer.default_local_dir)")
        models = _models(worker)
        state: dict[str, Any] = {}
        for name, (model, opt) in models.items():
            state[name] = _state(worker, name, model, opt)
        dcp.load(state, checkpoint_id=str(path / "model"), process_group=self.ctx.cpu_group)
        for name, (model, opt) in models.items():
            set_state_dict(model, opt, model_state_dict=state[name]["model"], optim_state_dict=state[name]["optim"],
                           options=_options(worker, name))
        for name, sched in _schedulers(worker).items():
            saved = meta["schedulers"].get(name)
            if saved is None:
                raise CheckpointError(f"checkpoint {path} has no lr schedule for {name}")
            sched.load_state_dict({**sched.state_dict(), **saved})
            for group, lr in zip(sched.optimizer.param_groups, sched.get_last_lr()):
                group["lr"] = lr
        rng_file = path / f"rng_rank{self.ctx.rank}.pt"
        if not rng_file.exists():
            rng_file = path / "rng_rank0.pt"
        torch.set_rng_state(torch.load(rng_file, weights_only=True))
        worker.version = int(meta["version"])
        if worker.kl_ctrl is not None and meta.get("kl_ctrl") is not None:
            worker.kl_ctrl.value = meta["kl_ctrl"]
        dist.barrier(group=self.ctx.cpu_group)
        logger.info("resumed from %s: step %d, version %d", path, meta["step"], worker.version)
        return {"step": int(meta["step"]), **meta.get("extra", {})}
