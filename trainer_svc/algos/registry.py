"""Name registries for advantage estimators and policy losses, and config access.

The registries are plain dicts, as verl's ``ADV_ESTIMATOR_REGISTRY`` /
``POLICY_LOSS_REGISTRY``: decorating a function registers it under a name, and the trainer
looks the name from the job spec up with ``get_*_fn``. Their public home is
:mod:`trainer_svc.core_algos` (verl's import path): code written for verl mutates
``core_algos.ADV_ESTIMATOR_REGISTRY`` in place, or rebinds it to a new dict (verl's own
tests do, and so does ``monkeypatch.setattr``). The functions here therefore look the
registry up where such code changes it, on every call (:func:`_current`), so a rebinding is
seen by ``register_*`` and ``get_*`` exactly as in verl, where these functions read the
module global of ``core_algos`` itself.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, MutableMapping
from enum import Enum
from typing import Any, Callable, Optional

import torch

from services.registry import ADV_ESTIMATORS, POLICY_LOSSES

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
_BUILT_IN = {"POLICY_LOSS_REGISTRY": POLICY_LOSS_REGISTRY, "ADV_ESTIMATOR_REGISTRY": ADV_ESTIMATOR_REGISTRY}
_PUBLIC_MODULE = "trainer_svc.core_algos"


def _current(name: str) -> MutableMapping[str, Callable]:
    """The registry dict called ``name`` as user code currently binds it.

    ``trainer_svc.core_algos.<name>`` if that module is loaded and binds a mapping other
    than the built-in dict; else this module's ``<name>`` (which tests may rebind too);
    both start as the same built-in dict.
    """
    public = getattr(sys.modules.get(_PUBLIC_MODULE), name, None)
    if isinstance(public, MutableMapping) and public is not _BUILT_IN[name]:
        return public
    return globals()[name]


# The job spec's checks (services.config.names) see these registries as they are bound now.
ADV_ESTIMATORS.attach(lambda: _current("ADV_ESTIMATOR_REGISTRY"))
POLICY_LOSSES.attach(lambda: _current("POLICY_LOSS_REGISTRY"))


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
        _current("POLICY_LOSS_REGISTRY")[name] = func
        return func

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    registry = _current("POLICY_LOSS_REGISTRY")
    if name not in registry:
        raise ValueError(f"Unsupported loss mode: {name}. Supported modes are: {list(registry)}")
    return registry[name]


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under a name or :class:`AdvantageEstimator`.

    Raises:
        ValueError: a *different* function is already registered under that name
            (re-registering the same function is a no-op).
    """

    def decorator(fn: Callable) -> Callable:
        name = _name_of(name_or_enum)
        registry = _current("ADV_ESTIMATOR_REGISTRY")
        existing = registry.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"Adv estimator {name} has already been registered: {existing} vs {fn}")
        registry[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable:
    """The advantage estimator registered under a name or enum member.

    Raises:
        ValueError: unknown name (case-sensitive). The message starts as verl's does
            (``"Unknown advantage estimator simply: <name>"``, which verl's tests match) and
            lists the registered names.
    """
    name = _name_of(name_or_enum)
    registry = _current("ADV_ESTIMATOR_REGISTRY")
    if name not in registry:
        raise ValueError(f"Unknown advantage estimator simply: {name}. Registered: {list(registry)}")
    return registry[name]


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
