"""Exceptions of the weight channel (all subclass ``WeightChannelError``)."""

from __future__ import annotations


class WeightChannelError(RuntimeError):
    """Base class of every weight-channel error."""


class VersionError(WeightChannelError, ValueError):
    """A policy version (or membership epoch) did not go forward."""


class PlanError(WeightChannelError, ValueError):
    """A bucket plan or tensor does not match what was announced, or is malformed."""


class TransferError(WeightChannelError):
    """A data-plane transfer failed (a peer died, a deadline passed, the publisher aborted)."""


class SnapshotError(WeightChannelError):
    """A snapshot could not be fetched, or its bytes are not a valid safetensors file."""
