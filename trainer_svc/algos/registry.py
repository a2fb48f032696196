"""Name registries for advantage estimators and policy losses, and config access.

The registries are plain dicts owned by this module (the only shared mutable objects of
the algorithms package, exactly like verl's ``ADV_ESTIMATOR_REGISTRY`` /
``POLICY_LOSS_REGISTRY``): decorating a function registers it under a name, and the
trainer looks the name from the job spec up with ``get_*_fn``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Callable, Optional

import torch

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdvantageEstimator",
    "PolicyLossFn",
    "cfg_get",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "register_adv_est",
    "register_policy_loss",
]

#: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
#: rollout_is_weights) -> (pg_loss: 0-dim tensor, metrics: dict[str, float])``
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]

POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}
ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (values are the config strings).

    Users need not extend it: ``register_adv_est("my_name")`` registers any string.
    """

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


def _name_of(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under ``name`` (a later registration replaces an
    earlier one, as in verl). Returns the function unchanged."""

    def decorator(func: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSS_REGISTRY[name] = func
        return func

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"Unsupported loss mode: {name}. Supported modes are: {list(POLICY_LOSS_REGISTRY)}")
    return POLICY_LOSS_REGISTRY[name]


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under a name or :class:`AdvantageEstimator`.

    Raises:
        ValueError: a *different* function is already registered under that name
            (re-registering the same function is a no-op).
    """

    def decorator(fn: Callable) -> Callable:
        name = _name_of(name_or_enum)
        existing = ADV_ESTIMATOR_REGISTRY.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"Adv estimator {name} has already been registered: {existing} vs {fn}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable:
    """The advantage estimator registered under a name or enum member.

    Raises:
        ValueError: unknown name.
    """
    name = _name_of(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"Unknown advantage estimator: {name}. Registered: {list(ADV_ESTIMATOR_REGISTRY)}")
    return ADV_ESTIMATOR_REGISTRY[name]


def cfg_get(config: Optional[Any], key: str, default: Any = None) -> Any:
    """Read ``key`` from a config that is a mapping (dict, OmegaConf DictConfig), an object
    with attributes (a dataclass / pydantic model / namespace), or ``None``.

    A missing key or a value of ``None`` gives ``default``.
    """
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        try:
            value = getattr(config, key)
        except (AttributeError, KeyError):
            getter = getattr(config, "get", None)
            value = getter(key, default) if callable(getter) else default
    return default if value is None else value
