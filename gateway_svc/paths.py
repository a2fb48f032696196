"""Check a submitted spec's file paths before the job is accepted.

A job the gateway starts runs in ``RUNS_DIR/<job id>/``, on the gateway's machine (local
launcher) or on a node that sees the same shared storage (ray). A relative path in the
spec would be resolved against that run dir, which nobody means, and a missing file would
only fail the job seconds later, deep in a service. So the gateway refuses both at submit,
naming each field:

    model.path: relative path 'runs/model' (the job runs in its own run dir: give an absolute path)
    data.train_files[0]: /data/train.parquet does not exist

Checked fields (those absent or empty are skipped): ``model.path``, ``model.tokenizer_path``,
``data.train_files``, ``data.val_files``, ``reward.custom_reward_function.path`` (when it names
a ``.py`` file rather than an importable module), ``reward.reward_model.path`` and
``reward.reward_model.tokenizer_path`` (when the reward model is enabled), ``critic.model_path``,
``rollout.multi_turn.tool_config_path``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: (dotted field, what must be there: a dir, a file, a .py file if it names one, or anything)
_FIELDS: tuple[tuple[str, str], ...] = (
    ("model.path", "dir"),
    ("model.tokenizer_path", "any"),
    ("data.train_files", "file"),
    ("data.val_files", "file"),
    ("reward.custom_reward_function.path", "pyfile"),
    ("reward.reward_model.path", "dir"),
    ("reward.reward_model.tokenizer_path", "any"),
    ("critic.model_path", "dir"),
    ("rollout.multi_turn.tool_config_path", "file"),
)


def _get(raw: dict[str, Any], dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def path_problems(resolved: dict[str, Any]) -> list[str]:
    """Every bad path of the resolved spec (a dict), as ``field: problem``; [] when all are fine."""
    problems: list[str] = []
    reward_model_on = bool(_get(resolved, "reward.reward_model.enable"))
    for dotted, kind in _FIELDS:
        if dotted.startswith("reward.reward_model.") and not reward_model_on:
            continue
        value = _get(resolved, dotted)
        if value in (None, "", []):
            continue
        values = value if isinstance(value, list) else [value]
        for i, item in enumerate(values):
            name = f"{dotted}[{i}]" if isinstance(value, list) else dotted
            if not isinstance(item, str):
                continue  # the spec's own validation speaks about types
            if kind == "pyfile" and not item.endswith(".py"):
                continue  # an importable dotted module, not a file
            p = Path(item).expanduser()
            if not p.is_absolute():
                problems.append(
                    f"{name}: relative path {item!r} (the job runs in its own run dir: give an absolute path)"
                )
            elif not p.exists():
                problems.append(f"{name}: {item} does not exist")
            elif kind == "dir" and not p.is_dir():
                problems.append(f"{name}: {item} is not a directory")
            elif kind in ("file", "pyfile") and not p.is_file():
                problems.append(f"{name}: {item} is not a file")
    return problems


__all__ = ["path_problems"]
