"""Bucket planning and packing: named tensors <-> flat uint8 buffers.

A version's parameters are packed, in the order the trainer yields them, into buckets:
flat ``uint8`` buffers of at most ``bucket_bytes``. Each tensor starts at a multiple of
``ALIGN`` bytes inside its bucket (so ``buffer[off:off+n].view(dtype)`` is legal for every
dtype). A tensor larger than a bucket is split into *pieces* (whole elements, in order)
over consecutive buckets, so the bucket size bounds every buffer on both ends whatever the
model; :class:`TensorAssembler` puts the pieces back together. An empty tensor takes no
bytes. Floating-point tensors may be cast to a narrower *wire dtype* while they are packed
(e.g. fp32 master weights sent as bf16 to replicas that serve bf16: half the bytes, and the
cast costs nothing extra since packing copies anyway). Pure torch, no network.
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
    """Where one tensor (or one piece of it) lives in its bucket: ``nbytes`` bytes from
    ``offset`` (multiple of ALIGN).

    A piece of a split tensor has ``tensor_nbytes`` (the whole tensor's bytes) larger than
    ``nbytes`` and starts ``piece_offset`` bytes into the tensor; a whole tensor has
    ``piece_offset == 0`` and ``tensor_nbytes`` equal to ``nbytes`` (-1 means the same)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    piece_offset: int = 0
    tensor_nbytes: int = -1

    @property
    def whole_nbytes(self) -> int:
        """Bytes of the whole tensor."""
        return self.nbytes if self.tensor_nbytes < 0 else self.tensor_nbytes

    @property
    def is_piece(self) -> bool:
        return self.piece_offset != 0 or self.whole_nbytes != self.nbytes

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
        if self.whole_nbytes != expect:
            raise PlanError(f"tensor {self.name!r}: nbytes {self.whole_nbytes} != prod{self.shape} * {itemsize} = {expect}")
        if self.is_piece:
            if self.nbytes <= 0 or self.piece_offset < 0 or self.piece_offset % itemsize or self.nbytes % itemsize \
                    or self.piece_offset + self.nbytes > expect:
                raise PlanError(f"tensor {self.name!r}: piece [{self.piece_offset}, {self.piece_offset + self.nbytes}) "
                                f"is not whole elements inside its {expect} bytes")
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

    @property
    def num_tensors(self) -> int:
        """Tensors that begin in this bucket (a split tensor counts once, in its first bucket)."""
        return sum(1 for s in self.specs if s.piece_offset == 0)

    def validate(self) -> None:
        """Raise ``PlanError`` unless specs are ordered, non-overlapping and inside the bucket."""
        end = 0
        for s in self.specs:
            s.validate(self.nbytes)
            if s.offset < end:
                raise PlanError(f"bucket {self.index}: tensor {s.name!r} at {s.offset} overlaps the previous one")
            end = s.offset + s.nbytes

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` views into ``buffer`` (no copy), in plan order (a bucket
        holding a piece of a split tensor needs a :class:`TensorAssembler` instead)."""
        if self.buffer is None:
            raise PlanError(f"bucket {self.index} has no buffer")
        for s in self.specs:
            yield s.name, view_tensor(self.buffer, s)


def view_tensor(buffer: torch.Tensor, spec: TensorSpec) -> torch.Tensor:
    """The tensor ``spec`` describes, as a view of the flat uint8 ``buffer`` (whole tensors only)."""
    if spec.is_piece:
        raise PlanError(f"tensor {spec.name!r} is split over buckets: use TensorAssembler")
    dtype = DTYPES[spec.dtype]
    raw = buffer[spec.offset : spec.offset + spec.nbytes]
    if spec.nbytes == 0:
        return torch.empty(spec.shape, dtype=dtype, device=buffer.device)
    return raw.view(dtype).view(spec.shape)


class TensorAssembler:
    """Turns a version's buckets, in order, back into ``(name, tensor)``.

    Whole tensors are views of their bucket (no copy). The pieces of a split tensor are
    copied, as they arrive, into one buffer of the tensor's size on the bucket's device;
    the tensor is yielded when its last piece arrived. Pieces must come in order without
    gap, and nothing else may come between the pieces of one tensor (``PlanError``)."""

    def __init__(self) -> None:
        self._open: TensorSpec | None = None
        self._buf: torch.Tensor | None = None
        self._filled = 0

    def check(self, s: TensorSpec) -> None:
        """Raise ``PlanError`` unless ``s`` may come next (plans can be checked before bytes)."""
        o = self._open
        if o is None:
            if s.is_piece and s.piece_offset != 0:
                raise PlanError(f"tensor {s.name!r}: piece at byte {s.piece_offset} without its beginning")
            return
        if (s.name, s.dtype, s.shape, s.whole_nbytes) != (o.name, o.dtype, o.shape, o.whole_nbytes) \
                or s.piece_offset != self._filled:
            raise PlanError(f"tensor {o.name!r} is incomplete ({self._filled} of {o.whole_nbytes} bytes) "
                            f"when {s.name!r} at byte {s.piece_offset} arrived")

    def advance(self, s: TensorSpec) -> None:
        """Account for ``s`` without data (plan-level tracking)."""
        self.check(s)
        if not s.is_piece:
            return
        if self._open is None:
            self._open, self._filled = s, 0
        self._filled += s.nbytes
        if self._filled == s.whole_nbytes:
            self._open, self._buf, self._filled = None, None, 0

    def feed(self, bucket: Bucket) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield the tensors ``bucket`` completes."""
        if bucket.buffer is None:
            raise PlanError(f"bucket {bucket.index} has no buffer")
        for s in bucket.specs:
            if not s.is_piece:
                self.check(s)
                yield s.name, view_tensor(bucket.buffer, s)
                continue
            self.check(s)
            if self._open is None:
                self._buf = torch.empty(s.whole_nbytes, dtype=torch.uint8, device=bucket.buffer.device)
            self._buf[s.piece_offset : s.piece_offset + s.nbytes].copy_(bucket.buffer[s.offset : s.offset + s.nbytes])
            buf = self._buf
            self.advance(s)
            if self._open is None:
                yield s.name, buf.view(DTYPES[s.dtype]).view(s.shape)

    def close(self) -> None:
        """Raise ``PlanError`` when the version ended inside a split tensor."""
        if self._open is not None:
            raise PlanError(f"the version ended inside tensor {self._open.name!r} "
                            f"({self._filled} of {self._open.whole_nbytes} bytes)")


def iter_tensors(buckets: Iterable[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """All ``(name, tensor)`` of a version's buckets, split tensors reassembled."""
    asm = TensorAssembler()
    for b in buckets:
        yield from asm.feed(b)
    asm.close()


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


def wire_dtype_for(t: torch.Tensor, wire: torch.dtype | None) -> torch.dtype:
    """The dtype ``t`` travels as: ``wire`` for a floating-point tensor with wider elements,
    else its own."""
    if wire is not None and t.is_floating_point() and t.dtype.itemsize > wire.itemsize:
        return wire
    return t.dtype


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    device: torch.device,
    alloc: Callable[[int, int], torch.Tensor] | None = None,
    zero_copy_min_bytes: int | None = None,
    wire_dtype: torch.dtype | None = None,
) -> Iterator[Bucket]:
    """Pack ``named_tensors`` lazily into buckets of at most ``bucket_bytes`` on ``device``.

    Each tensor is copied into the current bucket as soon as it is yielded (so the caller
    may produce tensors on demand, e.g. FSDP2 ``full_tensor()`` layer by layer, and drop
    them), and the caller can broadcast bucket k while bucket k+1 is being packed. Each
    yielded bucket has a ``buffer`` that is a prefix view of ``alloc(index, capacity)`` (a
    1-D uint8 tensor of at least ``capacity`` bytes on ``device``; default: a fresh one).
    A tensor that does not fit the rest of the current bucket and is larger than a bucket
    is split: its first piece fills the current bucket, the others follow in buckets of
    their own (whole elements each).

    ``wire_dtype``: floating-point tensors with wider elements are cast to it while packed.

    With ``zero_copy_min_bytes``, a C-contiguous tensor already on ``device`` (and not cast)
    with at least that many bytes is not copied: it becomes buckets of its own whose
    ``buffer`` is a uint8 view of the tensor's memory (``Bucket.borrowed``), split at
    ``bucket_bytes`` like any other. Raises ``PlanError`` for a duplicate name or an
    unsupported tensor.
    """
    if bucket_bytes < 1:
        raise PlanError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    if wire_dtype is not None and not wire_dtype.is_floating_point:
        raise PlanError(f"wire dtype must be floating point, got {wire_dtype}")
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
        dtype = wire_dtype_for(t, wire_dtype)
        dname, itemsize = dtype_name(dtype), dtype.itemsize
        shape = tuple(t.shape)
        nbytes = t.numel() * itemsize
        per_bucket = max(1, bucket_bytes // itemsize) * itemsize  # a piece's most bytes
        if (
            zero_copy_min_bytes is not None
            and dtype == t.dtype
            and nbytes >= max(zero_copy_min_bytes, 1)
            and t.is_contiguous()
            and t.device == device
            and not t.is_conj()
            and not t.is_neg()
        ):
            if specs:
                yield flush()
            raw = t.detach().reshape(-1).view(torch.uint8)
            for lo in range(0, nbytes, per_bucket):
                n = min(per_bucket, nbytes - lo)
                spec = TensorSpec(name=name, dtype=dname, shape=shape, offset=0, nbytes=n,
                                  piece_offset=lo, tensor_nbytes=nbytes)
                yield Bucket(index=index, nbytes=n, specs=[spec], buffer=raw[lo : lo + n], borrowed=True)
                index += 1
            continue
        flat = None
        done = 0  # bytes of this tensor packed so far
        while True:
            start = _align(fill)
            room = bucket_bytes - start
            if specs and nbytes - done > room and (nbytes <= bucket_bytes or room < itemsize):
                yield flush()  # it fits a fresh bucket (or not even one element fits here)
                continue
            n = nbytes - done if nbytes - done <= max(room, 0) else max(itemsize, room // itemsize * itemsize)
            n = min(n, nbytes - done)
            split = n < nbytes
            spec = TensorSpec(name=name, dtype=dname, shape=shape, offset=start, nbytes=n,
                              piece_offset=done if split else 0, tensor_nbytes=nbytes if split else -1)
            if n:
                if buf is None:
                    size = max(bucket_bytes, n)
                    buf = alloc(index, size) if alloc else torch.empty(size, dtype=torch.uint8, device=device)
                dst = buf[start : start + n].view(dtype)
                if split:
                    if flat is None:
                        flat = t.detach().reshape(-1)
                    dst.copy_(flat[done // itemsize : (done + n) // itemsize])
                else:
                    dst.view(shape).copy_(t.detach())
            specs.append(spec)
            fill = start + n
            done += n
            if fill >= bucket_bytes:
                yield flush()
            if done >= nbytes:
                break
    if specs:
        yield flush()


def plan_summary(buckets: Iterable[Bucket]) -> tuple[int, int, int]:
    """``(num_buckets, num_tensors, tensor_bytes)`` of a sequence of buckets."""
    nb = nt = tb = 0
    for b in buckets:
        nb += 1
        nt += b.num_tensors
        tb += sum(s.nbytes for s in b.specs)
    return nb, nt, tb
