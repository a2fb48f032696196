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

    def engine_args(self) -> dict[str, Any]:
        from services.config.lora import vllm_max_lora_rank

        return {"enable_lora": True, "max_loras": 1, "max_cpu_loras": 1, "max_lora_rank": vllm_max_lora_rank(self.rank)}

    def request(self):
        """The ``LoRARequest`` every generation request carries."""
        from vllm.lora.request import LoRARequest

        if self.adapter_dir is None:
            raise RuntimeError("LoraServing.prepare() first")
        return LoRARequest(LORA_NAME, LORA_ID, self.adapter_dir)

    def manifest(self):
        """The starting adapter's tensor names and shapes: what every version must hold."""
        from rollout_svc.weight_check import WeightManifest

        return WeightManifest.from_model(self.adapter_dir, tied=False)


# -- inside the vLLM worker ---------------------------------------------------------------------


def load_adapter_into_worker(worker: Any, named_tensors, check, adapter_dir: str) -> dict[str, Any]:
    """Check every tensor of one adapter version (``check``: a ``VersionCheck`` against the
    adapter's manifest), then replace the served adapter's weights with them. Same report as
    ``weight_stream.load_into_worker``; ``touched`` is never set: the adapter is swapped only
    once the whole version is in and checked, and the swap itself only replaces references."""
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
        swap_adapter(worker, tensors, adapter_dir)
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


def swap_adapter(worker: Any, tensors: dict, adapter_dir: str) -> None:
    """Build a vLLM ``LoRAModel`` from ``tensors`` (PEFT names) with the starting adapter's
    config, and put it in the worker's LoRA manager in place of adapter :data:`LORA_ID`
    (what ``add_adapter`` does for a ``LoRARequest(load_inplace=True)``)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    mgr = worker.model_runner.lora_manager
    manager = mgr._adapter_manager  # the model's LoRA slots; vLLM's own add_adapter goes through it too
    helper = PEFTHelper.from_local_dir(adapter_dir, mgr.max_position_embeddings)
    helper.validate_legal(mgr.lora_config)
    model = manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=LORA_ID, tensors=tensors, peft_helper=helper, device="cpu", dtype=mgr.lora_config.lora_dtype,
        model_vocab_size=mgr.vocab_size, weights_mapper=None if mapper is None else mapper.get_rename_mapper(),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    manager.remove_adapter(LORA_ID)
    manager.add_adapter(lora)
    manager.activate_adapter(LORA_ID)


def read_adapter_config(adapter_dir: str) -> dict:
    return json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
