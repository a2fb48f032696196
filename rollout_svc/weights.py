"""Checking and staging one policy version before it goes into vLLM.

A version arrives as an iterable of ``(name, tensor)`` in HuggingFace checkpoint format
(``model.layers.0.self_attn.q_proj.weight``, ...), whatever transport brought it (the weight
channel, a snapshot, a test). :func:`stage_weights` checks every name and shape against the
model's :class:`WeightManifest` and writes the set into one safetensors file the vLLM
workers then load in place. Nothing touches the engine until the whole set has passed, so a
bad update (unknown name, wrong shape, missing tensors, non-finite values) is refused with a
clear :class:`WeightUpdateError` and the replica keeps serving its current version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightUpdateError(ValueError):
    """A weight update was refused; the engine still serves the previous version."""


@dataclass(frozen=True)
class WeightManifest:
    """Expected checkpoint tensors: ``name -> shape``. ``optional`` names may be absent
    (``lm_head.weight`` of a model with tied embeddings)."""

    shapes: dict[str, tuple[int, ...]]
    optional: frozenset[str] = frozenset()

    @classmethod
    def from_model(cls, model: str, *, tied: bool) -> "WeightManifest | None":
        """Read names/shapes from a local model directory's safetensors headers.

        Returns None for a hub id (nothing local to check against; vLLM still validates).
        """
        from safetensors import safe_open

        d = Path(model)
        files = sorted(d.glob("*.safetensors")) if d.is_dir() else []
        if not files:
            return None
        shapes: dict[str, tuple[int, ...]] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    shapes[k] = tuple(h.get_slice(k).get_shape())
        optional = set()
        if tied and "model.embed_tokens.weight" in shapes:
            shapes.setdefault("lm_head.weight", shapes["model.embed_tokens.weight"])
            optional.add("lm_head.weight")
        return cls(shapes=shapes, optional=frozenset(optional))

    def to_json(self) -> str:
        return json.dumps({"shapes": {k: list(v) for k, v in self.shapes.items()}, "optional": sorted(self.optional)})


def stage_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    path: str,
    manifest: WeightManifest | None,
    dtype: str,
    *,
    require_all: bool = True,
) -> dict[str, int]:
    """Validate ``named_tensors`` and write them (cast to ``dtype``, contiguous, CPU) to ``path``.

    Raises :class:`WeightUpdateError` naming the first bad tensor. With ``require_all``, every
    non-optional manifest tensor must be present (a partial version would mix policies).
    Returns ``{"tensors": count, "bytes": total}``.
    """
    from safetensors.torch import save_file

    target = _DTYPES.get(dtype)
    out: dict[str, torch.Tensor] = {}
    nbytes = 0
    for item in named_tensors:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise WeightUpdateError(f"expected (name, tensor) pairs, got {type(item).__name__}")
        name, t = item
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise WeightUpdateError(f"expected (str, Tensor), got ({type(name).__name__}, {type(t).__name__})")
        if name in out:
            raise WeightUpdateError(f"tensor {name!r} sent twice in one version")
        if manifest is not None:
            if name not in manifest.shapes:
                raise WeightUpdateError(f"unknown tensor {name!r}: the served model has no such parameter")
            if tuple(t.shape) != manifest.shapes[name]:
                raise WeightUpdateError(f"tensor {name!r} has shape {tuple(t.shape)}, the model expects {manifest.shapes[name]}")
        if not t.is_floating_point():
            raise WeightUpdateError(f"tensor {name!r} has non-float dtype {t.dtype}")
        t = t.detach().to("cpu", dtype=target or t.dtype).contiguous()
        if not torch.isfinite(t).all():
            raise WeightUpdateError(f"tensor {name!r} contains NaN or Inf")
        out[name] = t
        nbytes += t.numel() * t.element_size()
    if not out:
        raise WeightUpdateError("empty weight update")
    if manifest is not None and require_all:
        missing = sorted(set(manifest.shapes) - set(out) - manifest.optional)
        if missing:
            raise WeightUpdateError(f"weight update lacks {len(missing)} tensors, e.g. {missing[:3]}")
    save_file(out, path)
    return {"tensors": len(out), "bytes": nbytes}
