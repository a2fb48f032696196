"""Load a user reward function the way verl does: a file path (or module) plus a name.

``path`` ending in ``.py`` (or naming an existing file) is executed as a fresh module;
anything else is imported as a dotted module name. ``name`` must be a callable attribute.
This runs the user's module top level, so the service only calls it inside a sandboxed
worker process (:mod:`reward_svc.sandbox.worker`), never in the service itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any


class RewardFunctionLoadError(RuntimeError):
    """The configured reward function could not be found or imported."""


def load_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``path`` and return its callable attribute ``name``.

    Raises :class:`RewardFunctionLoadError` naming the file/module and the problem.
    """
    if path.endswith(".py") or os.path.isfile(path):
        if not os.path.isfile(path):
            raise RewardFunctionLoadError(f"reward function file {path!r} does not exist")
        mod_name = f"meshrl_user_reward_{abs(hash(os.path.abspath(path)))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise RewardFunctionLoadError(f"cannot load {path!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise RewardFunctionLoadError(f"importing {path!r} failed: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(path)
        except Exception as exc:
            raise RewardFunctionLoadError(f"importing module {path!r} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if fn is None:
        raise RewardFunctionLoadError(f"reward function {name!r} not found in {path!r}")
    if not callable(fn):
        raise RewardFunctionLoadError(f"{name!r} in {path!r} is not callable")
    return fn
