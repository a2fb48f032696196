"""A test-only fault of the weight publisher: a candidate whose tensors are valid but wrong.

The canary gate exists for versions no shape or finiteness check can catch (a bad cast, a
disagreeing kernel, a corrupted bucket of finite numbers). To show it catches them, a test
sets ``MESHRL_TEST_WEIGHTS_FAULT`` in the trainer's environment::

    MESHRL_TEST_WEIGHTS_FAULT="candidate=2:negate:model.norm.weight"

and the publisher corrupts that tensor of the 2nd version it sends to the canaries, as the
version is published: ``negate`` (x -> -x: every logit flips sign) or ``reverse_rows``
(the first dimension reversed: a layer's rows permuted). The tensor keeps its name, shape,
dtype and finite values; the trainer's own weights are untouched (the publisher corrupts a
copy), so the next version is healthy again. Unset (always, outside tests): no effect.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator

import torch

log = logging.getLogger(__name__)
ENV = "MESHRL_TEST_WEIGHTS_FAULT"
OPS = {"negate": lambda t: -t, "reverse_rows": lambda t: t.flip(0)}


class CandidateFault:
    """Corrupts tensor ``name`` of the ``nth`` candidate (see module docstring)."""

    def __init__(self, nth: int, op: str, name: str) -> None:
        if op not in OPS or nth < 1 or not name:
            raise ValueError(f"{ENV}: want candidate=<n >= 1>:<{'|'.join(OPS)}>:<tensor name>")
        self.nth, self.op, self.name = nth, op, name
        self.candidates = 0

    @classmethod
    def from_env(cls) -> "CandidateFault | None":
        spec = os.environ.get(ENV, "")
        if not spec:
            return None
        try:
            which, op, name = spec.split(":", 2)
            key, _, nth = which.partition("=")
            if key != "candidate":
                raise ValueError(which)
            return cls(int(nth), op, name)
        except ValueError:
            raise ValueError(f"{ENV}={spec!r}: want candidate=<n>:<{'|'.join(OPS)}>:<tensor name>") from None

    def wrap(self, route: str, version: int, named_tensors: Iterable) -> Iterable:
        """``named_tensors`` of a version published along ``route``, corrupted if it is the one."""
        if route != "canaries":
            return named_tensors
        self.candidates += 1
        if self.candidates != self.nth:
            return named_tensors
        log.warning("%s: corrupting %s of v%d (%s) for a test", ENV, self.name, version, self.op)
        return self._corrupt(named_tensors)

    def _corrupt(self, named_tensors: Iterable) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in named_tensors:
            yield name, (OPS[self.op](t).contiguous() if name == self.name else t)
