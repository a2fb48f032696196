"""Base class for every block of the job spec.

Strict by default: unknown keys fail (a typo must never vanish silently), values are
validated on assignment, and every field is expected to carry a ``description``.
This module imports only pydantic: the gateway, the CLI and deployment checks load job
specs without torch or vLLM.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config block: ``extra="forbid"``, validated on assignment, frozen field names."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
