"""Checks of the names a job spec refers to, with "did you mean" suggestions.

A strict schema cannot know which advantage estimators, policy losses, reward scorers,
tool parsers or tools exist: they live in registries that code can extend. This module
asks those registries (:mod:`services.registry`: the services' built-in names, plus what
code in this process registered; no service package and no torch is imported), after the
spec itself validated, so a typo such as
``algorithm.adv_estimator=grpoo`` is reported by ``meshrl validate`` (and before
``meshrl run`` starts anything) instead of by a service a minute later:

    algorithm.adv_estimator: unknown advantage estimator 'grpoo' (did you mean 'grpo'?; known: gae, grpo, ...)

Checked: ``algorithm.adv_estimator``, ``actor.policy_loss.loss_mode``, the data sources of
``data.train_files``/``data.val_files`` when no custom reward function or reward model
scores them, ``rollout.multi_turn.format`` and each ``rollout.multi_turn.tools[].class_name``
(module found without importing it), ``trainer.logger``, and the LoRA keys against the model's
``config.json`` and the starting adapter's ``adapter_config.json`` (``services.config.lora``).
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Iterable
from typing import Any

from services.registry import (
    ADV_ESTIMATORS, LOGGERS, POLICY_LOSSES, SCORER_FAMILIES, SCORERS, TOOL_PARSERS, NameRegistry, scorer_family,
)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?; known: a, b, c)`` for an unknown ``name``."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?; " if close else ""
    shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
    return f" ({hint}known: {shown})"


def _unknown(path: str, what: str, name: str, known: Iterable[str]) -> str:
    return f"{path}: unknown {what} {name!r}{did_you_mean(name, known)}"


def _unknown_name(path: str, name: str, registry: NameRegistry) -> list[str]:
    """``[problem]`` when ``name`` is not in ``registry``, else ``[]``."""
    known = registry.names()
    return [] if name in known else [_unknown(path, registry.what, name, known)]


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def algorithm_problems(spec: Any) -> list[str]:
    out = []
    est = _get(spec, "algorithm.adv_estimator")
    if est is not None:
        out += _unknown_name("algorithm.adv_estimator", str(est), ADV_ESTIMATORS)
    loss = _get(spec, "actor.policy_loss.loss_mode")
    if loss is not None:
        out += _unknown_name("actor.policy_loss.loss_mode", str(loss), POLICY_LOSSES)
    return out


def data_sources(files: Iterable[str]) -> set[str]:
    """The ``data_source`` values of row files (only that column is read from parquet)."""
    from pathlib import Path

    from services.data.files import read_records

    out: set[str] = set()
    for f in files:
        if str(f).endswith(".parquet") and Path(f).is_file():
            import pyarrow.parquet as pq

            out |= {str(x) for x in pq.read_table(f, columns=["data_source"]).column("data_source").to_pylist()}
        else:
            out |= {str(r.get("data_source")) for r in read_records(f)}
    return out


def scorer_problems(spec: Any) -> list[str]:
    """Data sources no built-in scorer knows, when nothing else scores them."""
    reward = getattr(spec, "reward", None)
    if reward is None or _get(reward, "custom_reward_function.path") or _get(reward, "reward_model.enable"):
        return []
    scored = SCORERS.names()
    known = [*scored, *(f"{family}<name>" for family in SCORER_FAMILIES)]
    out = []
    for key in ("train_files", "val_files"):
        files = list(_get(spec, f"data.{key}") or [])
        try:
            sources = data_sources(files)
        except (OSError, ValueError, KeyError):
            continue  # unreadable files are reported by the file checks
        for src in sorted(s for s in sources - scored if scorer_family(s) is None):
            out.append(f"data.{key}: data_source {src!r} has no built-in scorer and no reward.custom_reward_function "
                       f"is set{did_you_mean(src, known)}")
    return out


def tool_problems(spec: Any) -> list[str]:
    mt = _get(spec, "rollout.multi_turn")
    if mt is None or not getattr(mt, "enable", False):
        return []
    out = []
    fmt = getattr(mt, "format", None)
    if fmt and "." not in fmt:
        out += _unknown_name("rollout.multi_turn.format", fmt, TOOL_PARSERS)
    for i, tool in enumerate(getattr(mt, "tools", None) or []):
        mod, _, cls = str(tool.class_name).rpartition(".")
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(f"rollout.multi_turn.tools.{i}.class_name: module {mod!r} of {tool.class_name!r} cannot be "
                       "found (is it installed or on PYTHONPATH?)")
    return out


def logger_problems(spec: Any) -> list[str]:
    names = _get(spec, "trainer.logger") or []
    return [p for n in names for p in _unknown_name("trainer.logger", str(n), LOGGERS)]


def name_problems(spec: Any) -> list[str]:
    """Every unknown registry name in ``spec`` (a validated job spec), one line each."""
    out: list[str] = []
    from services.config.lora import lora_problems

    for check in (algorithm_problems, scorer_problems, tool_problems, logger_problems, lora_problems):
        out += check(spec)
    return out
