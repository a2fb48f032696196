"""Bucket planning and packing: named tensors <-> flat uint8 buffers.

A version's parameters are packed, in the order the trainer yields them, into buckets:
flat ``uint8`` buffers of about ``bucket_bytes``. Each tensor starts at a multiple of
``ALIGN`` bytes inside its bucket (so ``buffer[off:off+n].view(dtype)`` is legal for every
dtype). A tensor larger than a bucket travels alone in a bucket of its own size; an empty
tensor takes no bytes. Pure torch, no network.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from services.weights.errors import PlanError

ALIGN = 64
"""Byte alignment of every tensor inside a bucket."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
"""Wire names of the dtypes the channel carries."""

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

MAX_NAME_CHARS = 1024


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def dtype_name(dtype: torch.dtype) -> str:
    """Wire name of ``dtype``; ``PlanError`` for a dtype the channel does not carry."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise PlanError(f"dtype {dtype} is not supported by the weight channel (supported: {sorted(DTYPES)})") from None


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives in its bucket: ``nbytes`` bytes from ``offset`` (multiple of ALIGN)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def validate(self, bucket_nbytes: int) -> None:
        """Raise ``PlanError`` unless the spec is self-consistent and fits ``bucket_nbytes``."""
        if not self.name or len(self.name) > MAX_NAME_CHARS:
            raise PlanError(f"tensor name must be 1..{MAX_NAME_CHARS} characters, got {self.name[:80]!r}")
        if self.dtype not in DTYPES:
            raise PlanError(f"tensor {self.name!r}: unknown dtype {self.dtype!r}")
        if any(d < 0 for d in self.shape):
            raise PlanError(f"tensor {self.name!r}: negative dimension in shape {self.shape}")
        itemsize = DTYPES[self.dtype].itemsize
        expect = math.prod(self.shape) * itemsize
        if self.nbytes != expect:
            raise PlanError(f"tensor {self.name!r}: nbytes {self.nbytes} != prod{self.shape} * {itemsize} = {expect}")
        if self.offset % ALIGN:
            raise PlanError(f"tensor {self.name!r}: offset {self.offset} is not a multiple of {ALIGN}")
        if self.offset + self.nbytes > bucket_nbytes:
            raise PlanError(
                f"tensor {self.name!r}: bytes [{self.offset}, {self.offset + self.nbytes}) "
                f"exceed the bucket's {bucket_nbytes} bytes"
            )


@dataclass
class Bucket:
    """One bucket: its index in the version, its tensors and (once packed) its buffer.

    ``buffer`` is a 1-D ``uint8`` tensor of ``nbytes`` bytes on the channel's device.
    """

    index: int
    nbytes: int
    specs: list[TensorSpec] = field(default_factory=list)
    buffer: torch.Tensor | None = None
    borrowed: bool = False
    """True when ``buffer`` is the caller's own tensor memory (zero-copy), not a packed copy."""

    def validate(self) -> None:
        """Raise ``PlanError`` unless specs are ordered, non-overlapping and inside the bucket."""
        end = 0
        for s in self.specs:
            s.validate(self.nbytes)
            if s.offset < end:
                raise PlanError(f"bucket {self.index}: tensor {s.name!r} at {s.offset} overlaps the previous one")
            end = s.offset + s.nbytes

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` views into ``buffer`` (no copy), in plan order."""
        if self.buffer is None:
            raise PlanError(f"bucket {self.index} has no buffer")
        for s in self.specs:
            yield s.name, view_tensor(self.buffer, s)


def view_tensor(buffer: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """The tensor ``spec`` describes, as a view of the flat uint8 ``buffer``."""
    dtype = DTYPES[spec.dtype]
    raw = buffer[spec.offset : spec.offset + spec.nbytes]
    if spec.nbytes == 0:
        return torch.empty(spec.shape, dtype=dtype, device=buffer.device)
    return raw.view(dtype).view(spec.shape)


def _check_tensor(name: object, t: object) -> torch.Tensor:
    if not isinstance(name, str) or not name:
        raise PlanError(f"tensor names must be non-empty strings, got {name!r}")
    if not isinstance(t, torch.Tensor):
        raise PlanError(f"{name!r}: expected a torch.Tensor, got {type(t).__name__}")
    if type(t).__name__ == "DTensor":
        raise PlanError(f"{name!r} is a DTensor: pass DTensor.full_tensor() (gathered on every trainer rank)")
    if t.is_sparse:
        raise PlanError(f"{name!r}: sparse tensors are not supported")
    dtype_name(t.dtype)
    return t


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    device: torch.device,
    alloc: Callable[[int, int], torch.Tensor] | None = None,
    zero_copy_min_bytes: int | None = None,
) -> Iterator[Bucket]:
    """Pack ``named_tensors`` lazily into buckets of about ``bucket_bytes`` on ``device``.

    Each tensor is copied into the current bucket as soon as it is yielded (so the caller
    may produce tensors on demand, e.g. FSDP2 ``full_tensor()`` layer by layer, and drop
    them), and the caller can broadcast bucket k while bucket k+1 is being packed. Each
    yielded bucket has a ``buffer`` that is a prefix view of ``alloc(index, capacity)`` (a
    1-D uint8 tensor of at least ``capacity`` bytes on ``device``; default: a fresh one).

    With ``zero_copy_min_bytes``, a C-contiguous tensor already on ``device`` with at least
    that many bytes is not copied: it becomes a bucket of its own whose ``buffer`` is a
    uint8 view of the tensor's memory (``Bucket.borrowed``). Raises ``PlanError`` for a
    duplicate name or an unsupported tensor.
    """
    if bucket_bytes < 1:
        raise PlanError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    seen: set[str] = set()
    specs: list[TensorSpec] = []
    buf: torch.Tensor | None = None
    fill = 0
    index = 0

    def flush() -> Bucket:
        nonlocal specs, buf, fill, index
        data = buf[:fill] if buf is not None else torch.empty(0, dtype=torch.uint8, device=device)
        b = Bucket(index=index, nbytes=fill, specs=specs, buffer=data)
        index += 1
        specs, buf, fill = [], None, 0
        return b

    for name, t in named_tensors:
        t = _check_tensor(name, t)
        if name in seen:
            raise PlanError(f"tensor {name!r} appears twice in one version")
        seen.add(name)
        nbytes = t.numel() * t.element_size()
        if (
            zero_copy_min_bytes is not None
            and nbytes >= max(zero_copy_min_bytes, 1)
            and t.is_contiguous()
            and t.device == device
            and not t.is_conj()
            and not t.is_neg()
        ):
            if specs:
                yield flush()
            spec = TensorSpec(name=name, dtype=dtype_name(t.dtype), shape=tuple(t.shape), offset=0, nbytes=nbytes)
            raw = t.detach().reshape(-1).view(torch.uint8)
            yield Bucket(index=index, nbytes=nbytes, specs=[spec], buffer=raw, borrowed=True)
            index += 1
            continue
        start = _align(fill)
        if specs and start + nbytes > bucket_bytes:
            yield flush()
            start = 0
        spec = TensorSpec(name=name, dtype=dtype_name(t.dtype), shape=tuple(t.shape), offset=start, nbytes=nbytes)
        if nbytes:
            if buf is None:  # a tensor larger than a bucket gets a buffer of its own size
                size = max(bucket_bytes, nbytes)
                buf = alloc(index, size) if alloc else torch.empty(size, dtype=torch.uint8, device=device)
            view_tensor(buf, spec).copy_(t.detach())
        specs.append(spec)
        fill = start + nbytes
        if fill >= bucket_bytes:
            yield flush()
    if specs:
        yield flush()


def plan_summary(buckets: Iterable[Bucket]) -> tuple[int, int, int]:
    """``(num_buckets, num_tensors, tensor_bytes)`` of a sequence of buckets."""
    nb = nt = tb = 0
    for b in buckets:
        nb += 1
        nt += len(b.specs)
        tb += sum(s.nbytes for s in b.specs)
    return nb, nt, tb
