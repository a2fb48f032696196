"""Launcher kinds and the classes that implement them, imported when first asked for.

    launcher = make_launcher("ray", address="auto")          # imports launchers/ray.py only now

The table names each implementation by ``module:Class`` instead of importing it, so a
gateway that runs local jobs never imports Ray, and ``base.py`` (which every implementation
imports) knows none of them: the modules form no cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

from gateway_svc.launchers.base import LaunchError, Launcher

#: kind -> "module:Class"; the class's own ``kind`` is the key.
LAUNCHERS: dict[str, str] = {
    "local": "gateway_svc.launchers.local:LocalLauncher",
    "ray": "gateway_svc.launchers.ray:RayLauncher",
    "deployment": "gateway_svc.launchers.deployment:DeploymentLauncher",
}


def launcher_class(kind: str) -> type[Launcher]:
    """The class registered for ``kind`` (its module imported now)."""
    try:
        target = LAUNCHERS[kind]
    except KeyError:
        known = ", ".join(repr(k) for k in LAUNCHERS)
        raise LaunchError(f"unknown launcher {kind!r}; expected one of {known}") from None
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def make_launcher(kind: str, **kwargs: Any) -> Launcher:
    """A launcher of ``kind`` ("local", "ray" or "deployment"), built with ``kwargs``."""
    return launcher_class(kind)(**kwargs)
