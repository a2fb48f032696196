"""``services.restart``: how a job's services are supervised (see services/supervision.py)."""

from __future__ import annotations

from pydantic import Field

from services.config.base import StrictModel


class RestartConfig(StrictModel):
    """Supervision of a job's services (``services.restart``)."""

    max_restarts: int = Field(
        3, ge=0, le=10_000, description="restarts allowed per service over the job; one more crash fails the job"
    )
    backoff_s: float = Field(1.0, ge=0, le=3600, description="delay before the first restart of a service")
    backoff_max_s: float = Field(30.0, ge=0, le=3600, description="the delay doubles per restart up to this")
    heartbeat_timeout_s: float = Field(
        60.0, gt=0, le=86_400,
        description="a running service whose health probe stays silent this long is killed and restarted",
    )
    stall_warn_s: float = Field(
        120.0, gt=0, le=86_400,
        description="no sample generated, scored or trained for this long: status and log say the job is stalled, and on what",
    )
    stall_timeout_s: float = Field(
        1800.0, gt=0, le=604_800, description="stalled this long: the job fails with the reason"
    )
