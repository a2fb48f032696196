"""The one exception type :func:`services.wire.decode` raises for bad input."""

from __future__ import annotations


class WireError(ValueError):
    """A frame (or chunk sequence) is malformed, truncated, too large or of an unknown
    version. The message names the field and the problem. Raised by every decoding entry
    point of :mod:`services.wire` for any bad input; encoding raises :class:`TypeError`
    (an unsupported Python type) or :class:`WireError` (e.g. a frame over the size limit).
    """
