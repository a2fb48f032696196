"""Checking a policy version before vLLM serves it: names, shapes, dtypes, completeness.

A version arrives as ``(name, tensor)`` pairs in HuggingFace checkpoint format
(``model.layers.0.self_attn.q_proj.weight``, ...). :class:`VersionCheck` checks them one
at a time, as they stream into the model, against the served model's
:class:`WeightManifest` (read once from the model directory's safetensors headers): an
unknown name, a wrong shape, a non-float dtype, a name sent twice or non-finite values
raise :class:`WeightUpdateError` naming the tensor; ``finish()`` refuses an empty or
incomplete version (a partial version would mix policies). What the replica does with a
refusal -- keep serving, or stay paused until a complete version is loaded -- is
``rollout_svc.weight_stream``'s business.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightUpdateError(ValueError):
    """A weight update was refused."""


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

    @classmethod
    def from_json(cls, text: str | None) -> "WeightManifest | None":
        if not text:
            return None
        d = json.loads(text)
        return cls(shapes={k: tuple(int(x) for x in v) for k, v in d["shapes"].items()},
                   optional=frozenset(d.get("optional", ())))


def all_finite(t: torch.Tensor) -> bool:
    """True when no element of the floating-point tensor ``t`` is NaN or +-Inf.

    One reduction pass: ``aminmax`` propagates NaN, and an infinity is the minimum or the
    maximum, so both ends are finite exactly when every element is. (``isfinite(t).all()``
    says the same but materialises a bool tensor of ``t``'s size first: on a CPU replica it
    cost more than loading the weights.)"""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


class VersionCheck:
    """Checks one version's tensors as they stream by (see module docstring)."""

    def __init__(self, manifest: WeightManifest | None, *, require_all: bool = True, check_finite: bool = True):
        self.manifest = manifest
        self.require_all = require_all
        self.check_finite = check_finite
        self.seen: set[str] = set()
        self.nbytes = 0

    def check(self, item: object) -> tuple[str, torch.Tensor]:
        """Return ``item`` as ``(name, tensor)`` or raise :class:`WeightUpdateError`."""
        if not (isinstance(item, tuple) and len(item) == 2):
            raise WeightUpdateError(f"expected (name, tensor) pairs, got {type(item).__name__}")
        name, t = item
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise WeightUpdateError(f"expected (str, Tensor), got ({type(name).__name__}, {type(t).__name__})")
        if name in self.seen:
            raise WeightUpdateError(f"tensor {name!r} sent twice in one version")
        m = self.manifest
        if m is not None:
            if name not in m.shapes:
                raise WeightUpdateError(f"unknown tensor {name!r}: the served model has no such parameter")
            if tuple(t.shape) != m.shapes[name]:
                raise WeightUpdateError(f"tensor {name!r} has shape {tuple(t.shape)}, the model expects {m.shapes[name]}")
        if not t.is_floating_point():
            raise WeightUpdateError(f"tensor {name!r} has non-float dtype {t.dtype}")
        if self.check_finite and not all_finite(t):
            raise WeightUpdateError(f"tensor {name!r} contains NaN or Inf")
        self.seen.add(name)
        self.nbytes += t.numel() * t.element_size()
        return name, t

    def finish(self) -> dict[str, int]:
        """Refuse an empty or (with ``require_all``) incomplete version; return its totals."""
        if not self.seen:
            raise WeightUpdateError("empty weight update")
        m = self.manifest
        if m is not None and self.require_all:
            missing = sorted(set(m.shapes) - self.seen - m.optional)
            if missing:
                raise WeightUpdateError(f"weight update lacks {len(missing)} tensors, e.g. {missing[:3]}")
        return {"tensors": len(self.seen), "bytes": self.nbytes}


def write_checked_file(
    named_tensors: Iterable[tuple[str, torch.Tensor]], path: str, manifest: WeightManifest | None, dtype: str
) -> dict[str, int]:
    """Local loads only (tensors already in the replica's own process, e.g. a test or an
    operator's checkpoint): check the whole set, then write it (cast to ``dtype``) as one
    safetensors file for the worker to load. Nothing is written unless every tensor passed,
    so the engine is never touched by a bad set. The weight channel never comes here: it
    streams into the worker (``rollout_svc.weight_stream``)."""
    from safetensors.torch import save_file

    target = _DTYPES.get(dtype)
    check = VersionCheck(manifest)
    out: dict[str, torch.Tensor] = {}
    for item in named_tensors:
        name, t = check.check(item)
        out[name] = t.detach().to("cpu", dtype=target or t.dtype).contiguous()
    stats = check.finish()
    save_file(out, path)
    return stats
