"""Prometheus metrics and the /health, /ready, /metrics endpoints every service serves.

Each service owns its own ``CollectorRegistry`` (no module-level global state) and
passes it to :class:`MetricsServer`. Metric names follow ``meshrl_<service>_<what>_<unit>``,
e.g. ``meshrl_rollout_tokens_total``, ``meshrl_trainer_step_seconds``.
"""

from services.metrics.server import MetricsServer

__all__ = ["MetricsServer"]
