"""LoRA on the replica: vLLM serves the job's adapter over the base model, and each version
from the weight channel replaces the adapter's weights in place.

With ``model.lora_rank > 0`` the engine starts vLLM with ``enable_lora`` (one adapter slot,
``max_lora_rank`` the smallest vLLM allows at or above the job's rank) and sends every
request with one :class:`~vllm.lora.request.LoRARequest` (id 1, ``meshrl-policy``). Until
the first version arrives that request names a starting adapter on disk: the job's
``model.lora_adapter_path``, or a zero adapter written at start (``lora_B = 0``: exactly the
base model, which is what a fresh trainer adapter is too).

A version from the trainer is the adapter's tensors only, by PEFT's saved names. Inside the
vLLM worker (:func:`load_adapter_into_worker`) they are checked against the starting
adapter's manifest (names, shapes, finite values), built into a vLLM ``LoRAModel`` in
memory and swapped into the worker's LoRA manager under the same id: the in-place load
that a ``LoRARequest(load_inplace=True)`` does from a directory, without a file. Nothing
reaches the model before the whole version is checked, so a bad version leaves the old
adapter serving.

An engine can also serve several jobs' adapters at once (``RolloutEngine(...,
adapter_slots=K)``, :class:`AdapterSlots`): each job gets a vLLM LoRA id of its own (its
slot, 1..K), its own starting adapter and manifest, and its versions swap only that id.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LORA_ID = 1
LORA_NAME = "meshrl-policy"


def write_zero_adapter(model_path: str, rank: int, alpha: float, targets: str | list[str], out_dir: str | Path,
                       trust_remote_code: bool = False) -> Path:
    """A PEFT adapter directory for ``model_path`` whose weights are all zero (the base
    policy): the model is built on the meta device, so no weight is read or allocated."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from services.config.lora import linear_widths_from_config, resolve_targets

    config = transformers.AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        base = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    widths = linear_widths_from_config(config.to_dict())
    target = sorted(resolve_targets(targets, widths)) if widths is not None or not isinstance(targets, str) else targets
    peft = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules=target, lora_dropout=0.0,
                                           bias="none", task_type="CAUSAL_LM"), autocast_adapter_dtype=False)
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in get_peft_model_state_dict(peft).items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(s, dtype=torch.float32) for k, (s, _) in shapes.items()},
              str(out / "adapter_model.safetensors"))
    peft.peft_config["default"].base_model_name_or_path = str(model_path)
    peft.peft_config["default"].save_pretrained(str(out))
    return out


@dataclass
class LoraServing:
    """What a replica needs to serve the job's adapter (from its view's model block)."""

    rank: int
    alpha: float
    targets: str | list[str]
    adapter_dir: str | None = None
    """The starting adapter (the job's ``lora_adapter_path``, or a zero adapter once :meth:`prepare` ran)."""
    _tmp: Any = field(default=None, repr=False)

    @classmethod
    def from_model_config(cls, m: Any) -> "LoraServing | None":
        if not getattr(m, "lora_rank", 0):
            return None
        return cls(rank=m.lora_rank, alpha=m.lora_alpha, targets=m.target_modules, adapter_dir=m.lora_adapter_path)

    def prepare(self, model_path: str, trust_remote_code: bool = False) -> str:
        """The starting adapter's directory (writing the zero adapter when the job has none)."""
        if self.adapter_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="meshrl-lora-")
            self.adapter_dir = str(write_zero_adapter(model_path, self.rank, self.alpha, self.targets, self._tmp.name,
                                                      trust_remote_code))
        return self.adapter_dir

    def engine_args(self, slots: int = 1) -> dict[str, Any]:
        """vLLM's LoRA arguments: ``slots`` adapters at once, each of rank up to this one's."""
        return {"enable_lora": True, "max_loras": slots, "max_cpu_loras": slots, "max_lora_rank": self.max_lora_rank}

    @property
    def max_lora_rank(self) -> int:
        """vLLM's ``max_lora_rank`` for this rank (the smallest allowed one at or above it)."""
        from services.config.lora import vllm_max_lora_rank

        return vllm_max_lora_rank(self.rank)

    def request(self, lora_id: int = LORA_ID, name: str = LORA_NAME):
        """The ``LoRARequest`` every generation request carries (``lora_id``/``name``: the
        slot and its name on an engine that serves several adapters)."""
        from vllm.lora.request import LoRARequest

        if self.adapter_dir is None:
            raise RuntimeError("LoraServing.prepare() first")
        return LoRARequest(name, lora_id, self.adapter_dir)

    def same_settings(self, other: "LoraServing") -> bool:
        """Whether ``other`` asks for the same adapter (rank, alpha, targets, starting directory)."""
        def targets(t):
            return t if isinstance(t, str) else sorted(t)

        return (self.rank, float(self.alpha), targets(self.targets)) == (
            other.rank, float(other.alpha), targets(other.targets)) and (
            other.adapter_dir is None or other.adapter_dir == self.adapter_dir)

    def manifest(self):
        """The starting adapter's tensor names and shapes: what every version must hold."""
        from rollout_svc.weight_check import WeightManifest

        return WeightManifest.from_model(self.adapter_dir, tied=False)


# -- inside the vLLM worker ---------------------------------------------------------------------


def load_adapter_into_worker(worker: Any, named_tensors, check, adapter_dir: str,
                             lora_id: int = LORA_ID) -> dict[str, Any]:
    """Check every tensor of one adapter version (``check``: a ``VersionCheck`` against the
    adapter's manifest), then replace the weights of the adapter served under ``lora_id``
    with them. Same report as ``weight_stream.load_into_worker``; ``touched`` is never set:
    the adapter is swapped only once the whole version is in and checked, and the swap
    itself only replaces references."""
    from rollout_svc.weight_check import WeightUpdateError

    t0 = time.perf_counter()
    result: dict[str, Any] = {"ok": False, "tensors": 0, "bytes": 0, "touched": False, "error": None,
                              "refused": False, "refreshed_kernels": 0}
    waited = checked = 0.0
    try:
        tensors = {}
        it = iter(named_tensors)
        while True:
            t1 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                break
            t2 = time.perf_counter()
            name, t = check.check(item)
            tensors[name] = t
            waited += t2 - t1
            checked += time.perf_counter() - t2
        check.finish()
        t3 = time.perf_counter()
        swap_adapter(worker, tensors, adapter_dir, lora_id)
    except Exception as e:  # noqa: BLE001 -- reported to the main process, which decides
        result["error"] = f"{type(e).__name__}: {e}"
        result["refused"] = isinstance(e, WeightUpdateError)
    else:
        result.update(ok=True, tensors=len(check.seen), bytes=check.nbytes)
        result["timing"] = {"wait_s": waited, "check_s": checked, "reload_s": time.perf_counter() - t3,
                            "refresh_s": 0.0}
    result.setdefault("timing", {"wait_s": waited, "check_s": checked, "reload_s": 0.0, "refresh_s": 0.0})
    result["seconds"] = time.perf_counter() - t0
    return result


def swap_adapter(worker: Any, tensors: dict, adapter_dir: str, lora_id: int = LORA_ID) -> None:
    """Build a vLLM ``LoRAModel`` from ``tensors`` (PEFT names) with the starting adapter's
    config, and put it in the worker's LoRA manager in place of adapter ``lora_id``
    (what ``add_adapter`` does for a ``LoRARequest(load_inplace=True)``). The other ids'
    adapters are not touched: vLLM keeps one slot of its stacked LoRA weights per id, and
    the swap rewrites only this id's slot."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    mgr = worker.model_runner.lora_manager
    manager = mgr._adapter_manager  # the model's LoRA slots; vLLM's own add_adapter goes through it too
    helper = PEFTHelper.from_local_dir(adapter_dir, mgr.max_position_embeddings)
    helper.validate_legal(mgr.lora_config)
    model = manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=lora_id, tensors=tensors, peft_helper=helper, device="cpu", dtype=mgr.lora_config.lora_dtype,
        model_vocab_size=mgr.vocab_size, weights_mapper=None if mapper is None else mapper.get_rename_mapper(),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    manager.remove_adapter(lora_id)
    manager.add_adapter(lora)
    manager.activate_adapter(lora_id)


def assign_slot(worker: Any, lora_id: int, name: str, adapter_dir: str) -> None:
    """Serve the adapter in ``adapter_dir`` (a PEFT directory) under ``lora_id``, replacing
    whatever that id served: vLLM's own loader and its in-place replacement
    (``load_inplace``), so the directory is checked as vLLM checks any adapter (its rank
    against ``max_lora_rank``, its modules against the model's)."""
    from vllm.lora.request import LoRARequest

    worker.model_runner.lora_manager.add_adapter(LoRARequest(name, lora_id, adapter_dir, load_inplace=True))


def free_slot(worker: Any, lora_id: int) -> bool:
    """Stop serving anything under ``lora_id``: its stacked weights slot is freed (a later
    adapter takes it over whole). False when nothing was served under it."""
    return worker.model_runner.lora_manager.remove_adapter(lora_id)


def load_adapter_file(worker: Any, path: str, adapter_dir: str, lora_id: int) -> dict[str, Any]:
    """Local loads: the adapter tensors of the safetensors file ``path`` (already checked
    against the adapter's manifest) replace those served under ``lora_id``."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    swap_adapter(worker, tensors, adapter_dir, lora_id)
    return {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


# -- several adapters on one engine ---------------------------------------------------------------


class AdapterSlots:
    """Which job key holds which of an engine's ``count`` adapter slots (vLLM LoRA ids
    1..count). Pure bookkeeping, no vLLM: the engine asks it for a slot when a job attaches
    and gives the slot back when the job leaves.

    Each assignment gets a name of its own (``meshrl-s<slot>-a<n>``, ``n`` counting every
    assignment of this engine): vLLM's prefix cache keys blocks by the LoRA's name, so a slot
    reused by another job never reuses the previous job's cached KV."""

    def __init__(self, count: int) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"adapter_slots must be a positive integer (got {count!r})")
        self.count = count
        self._by_key: dict[str, int] = {}
        self._names: dict[str, str] = {}
        self._assignments = 0

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def slot(self, key: str) -> int:
        """The slot ``key`` holds (KeyError when it holds none)."""
        return self._by_key[key]

    def name(self, key: str) -> str:
        """The name of ``key``'s assignment (the base of its ``LoRARequest`` names)."""
        return self._names[key]

    def keys(self) -> list[str]:
        return list(self._by_key)

    def free(self) -> list[int]:
        """The slots no key holds, lowest first."""
        used = set(self._by_key.values())
        return [s for s in range(1, self.count + 1) if s not in used]

    def take(self, key: str) -> int:
        """A slot for ``key`` (the lowest free one); ValueError for a key that holds one
        already or an empty key, RuntimeError (one line, naming the holders) when all are taken."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"an adapter key must be a non-empty string (got {key!r})")
        if key in self._by_key:
            raise ValueError(f"adapter key {key!r} already holds slot {self._by_key[key]}")
        free = self.free()
        if not free:
            raise RuntimeError(f"no free adapter slot for {key!r}: all {self.count} are held "
                               f"({', '.join(sorted(self._by_key))}); release one first")
        self._assignments += 1
        self._by_key[key] = free[0]
        self._names[key] = f"meshrl-s{free[0]}-a{self._assignments}"
        return free[0]

    def release(self, key: str) -> int:
        """Give ``key``'s slot back; returns it (KeyError when ``key`` holds none)."""
        if key not in self._by_key:
            raise KeyError(f"adapter key {key!r} holds no slot")
        self._names.pop(key)
        return self._by_key.pop(key)


def serving_problems(job: LoraServing, max_lora_rank: int, model_config: dict | None = None) -> list[str]:
    """Why ``job``'s adapter cannot be served by an engine started with ``max_lora_rank``
    (one line each; [] when it can). Ranks below the engine's and other target modules are
    fine: vLLM keeps every adapter in slots of the largest rank (zero-padded) and gives every
    linear layer of the model a LoRA slot, zero where an adapter has no weights for it.
    ``model_config``: the model's ``config.json`` (target modules checked when its layout is
    known); a starting adapter directory's ``adapter_config.json`` must agree with the keys."""
    from services.config import lora as spec

    out = spec.static_problems(job.rank, job.alpha, job.targets, job.adapter_dir)
    if isinstance(job.rank, bool) or not isinstance(job.rank, int) or job.rank < 1:
        return out + [f"an adapter's rank must be a positive integer (got {job.rank!r})"]
    if job.rank > max_lora_rank:
        out.append(f"adapter rank {job.rank} exceeds this engine's max_lora_rank {max_lora_rank} "
                   "(start the engine with a LoRA rank at least as large)")
    widths = spec.linear_widths_from_config(model_config) if model_config else None
    if widths is not None and not out:
        out += spec.target_problems(job.rank, job.targets, widths)
    if job.adapter_dir is not None and not out:
        try:
            out += spec.adapter_problems(spec.read_adapter_config(job.adapter_dir), job.rank, job.alpha, job.targets)
        except ValueError as exc:
            out.append(str(exc))
    return out


def read_adapter_config(adapter_dir: str) -> dict:
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
