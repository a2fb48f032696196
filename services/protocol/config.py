"""``DataProtoConfig``: the process-wide auto-padding switch (verl semantics).

``DataProtoConfig.auto_padding`` is a class-level property: setting it to ``True`` lets
``chunk`` split batches whose length is not a multiple of the chunk count (and lets the
dispatch layer pad with :func:`services.protocol.pad_dataproto_to_divisor`).  It also reads as
``True`` when the environment variable ``VERL_AUTO_PADDING`` or ``MESHRL_AUTO_PADDING`` is
``"1"``/``"true"`` (any case).  A single ``DataProto`` can enable padding for itself alone
through ``meta_info[DataProtoConfig.auto_padding_key] = True`` (what
``from_dict(..., auto_padding=True)`` does).
"""

from __future__ import annotations

import os

AUTO_PADDING_ENV_VARS: tuple[str, ...] = ("VERL_AUTO_PADDING", "MESHRL_AUTO_PADDING")
"""Environment variables that switch auto-padding on for the whole process."""

_TRUE_STRINGS = frozenset({"1", "TRUE"})


def _env_enabled() -> bool:
    return any(os.getenv(name, "").strip().upper() in _TRUE_STRINGS for name in AUTO_PADDING_ENV_VARS)


class _DataProtoConfigMeta(type):
    """Metaclass giving ``DataProtoConfig`` a settable class-level ``auto_padding`` property."""

    auto_padding_key: str = "_verl_auto_padding"

    def __init__(cls, name: str, bases: tuple[type, ...], ns: dict) -> None:
        super().__init__(name, bases, ns)
        cls._config = {}

    @property
    def auto_padding(cls) -> bool:
        """True when the class switch or one of :data:`AUTO_PADDING_ENV_VARS` is on."""
        return _env_enabled() or bool(cls._config.get(cls.auto_padding_key, False))

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a boolean, got {enabled!r} as {type(enabled)}")
        cls._config[cls.auto_padding_key] = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Holder of the auto-padding switch; see the module docstring."""


PADDING_SIZE_KEY = "_padding_size_key_x123d"
"""Keyword verl's dispatch layer uses to pass the padding size to the collect step."""
