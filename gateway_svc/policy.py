"""The operator's policy: what a job submitted to the gateway may do beyond the defaults.

The gateway's operator decides, with flags of ``meshrl gateway`` (docs/security.md); a job
spec cannot grant itself anything:

    --allow trust_remote_code,network,unsandboxed_tools,bind_any,weak_sandbox
    --input-root /models --input-root /data        (repeatable)

At submit every field of the resolved spec is checked (:func:`policy_problems`); each
problem is one line naming the field, and any problem refuses the job (REST 400, gRPC
INVALID_ARGUMENT):

* **capabilities** -- ``model.trust_remote_code: true`` needs ``trust_remote_code``;
  ``reward.allow_network`` or a tool's ``allow_network`` needs ``network``; a tool with
  ``sandbox: false`` needs ``unsandboxed_tools``; a bind address other than loopback
  (``services.host``, ``weights.host``, the embedded broker's ``queues.address``) needs
  ``bind_any``; the same for the tools of a ``tool_config_path`` file, which the gateway
  reads once and moves into the spec (:func:`inline_tool_config`). ``weak_sandbox`` lets
  user code run in the weaker process sandbox where bubblewrap cannot run (it is handed to
  the job as ``MESHRL_SANDBOX_WEAK=1``).
* **inputs** (model, tokenizer, data, chat template file, reward function, reward model,
  critic, tool config, TLS files) must be absolute and lie under one of the input roots
  once every symlink is resolved; a reward function must be a ``.py`` file (or a dotted
  module name, imported inside the sandbox).
* **outputs** (checkpoints, the metrics file, the weight snapshot dir, the broker's
  append-only file) must stay inside the job's run dir: relative paths are resolved against
  it and may not climb out with ``..``; absolute paths elsewhere are refused.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Everything ``--allow`` can open.
CAPABILITIES = ("trust_remote_code", "network", "unsandboxed_tools", "bind_any", "weak_sandbox")

#: (dotted field, what must be there: a dir, a file, a .py file or module, or anything)
INPUT_FIELDS: tuple[tuple[str, str], ...] = (
    ("model.path", "dir"),
    ("model.tokenizer_path", "any"),
    ("model.lora_adapter_path", "dir"),
    ("data.train_files", "file"),
    ("data.val_files", "file"),
    ("data.chat_template", "template"),
    ("reward.custom_reward_function.path", "pyfile"),
    ("reward.tokenizer_path", "any"),
    ("reward.reward_model.path", "dir"),
    ("reward.reward_model.tokenizer_path", "any"),
    ("critic.model_path", "dir"),
    ("rollout.multi_turn.tool_config_path", "file"),
    ("queues.tls_ca_file", "file"),
    ("queues.tls_cert_file", "file"),
    ("queues.tls_key_file", "file"),
)
#: Fields the job writes to: inside its run dir only.
OUTPUT_FIELDS = ("trainer.default_local_dir", "trainer.metrics_file", "weights.snapshot_dir", "queues.aof_path")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class OperatorPolicy:
    """``allow``: capabilities opened (:data:`CAPABILITIES`); ``input_roots``: directories
    a job's inputs may come from (resolved)."""

    allow: frozenset[str] = frozenset()
    input_roots: tuple[Path, ...] = field(default_factory=tuple)

    @classmethod
    def make(cls, allow: Iterable[str] = (), input_roots: Iterable[str | Path] = ()) -> "OperatorPolicy":
        names = {a.strip() for item in allow for a in str(item).split(",") if a.strip()}
        unknown = sorted(names - set(CAPABILITIES))
        if unknown:
            raise ValueError(f"--allow: unknown {', '.join(unknown)} (known: {', '.join(CAPABILITIES)})")
        roots = tuple(dict.fromkeys(Path(os.path.realpath(Path(r).expanduser())) for r in input_roots))
        return cls(frozenset(names), roots)


def _get(raw: dict[str, Any], dotted: str) -> Any:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _values(raw: dict[str, Any], dotted: str) -> list[tuple[str, Any]]:
    value = _get(raw, dotted)
    if value in (None, "", []):
        return []
    if isinstance(value, list):
        return [(f"{dotted}[{i}]", v) for i, v in enumerate(value)]
    return [(dotted, value)]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _capability_problems(spec: dict[str, Any], allow: frozenset[str]) -> list[str]:
    out: list[str] = []

    def need(cap: str, name: str, what: str) -> None:
        if cap not in allow:
            out.append(f"{name}: {what} is not allowed by this gateway (its operator can open it with --allow {cap})")

    if _get(spec, "model.trust_remote_code") is True:
        need("trust_remote_code", "model.trust_remote_code", "running the checkpoint's own code")
    if _get(spec, "reward.allow_network") is True:
        need("network", "reward.allow_network", "network access for user code")
    tools = _get(spec, "rollout.multi_turn.tools") or []
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        out += _tool_problems(tool, f"rollout.multi_turn.tools[{i}]", allow)
    for name in ("services.host", "weights.host"):
        host = _get(spec, name)
        if isinstance(host, str) and host and not is_loopback(host):
            need("bind_any", name, f"listening on {host!r} (not loopback)")
    address = _get(spec, "queues.address")
    if _get(spec, "queues.type") == "embedded" and isinstance(address, str) and address:
        host = address.rsplit(":", 1)[0]
        if not is_loopback(host):
            need("bind_any", "queues.address", f"listening on {host!r} (not loopback)")
    return out


def _tool_problems(tool: Any, name: str, allow: frozenset[str]) -> list[str]:
    """What one tool entry (a spec's or a tool config file's) asks for beyond ``allow``."""
    out: list[str] = []
    if not isinstance(tool, dict):
        return out  # the spec's own validation speaks about types
    if tool.get("allow_network") is True and "network" not in allow:
        out.append(f"{name}.allow_network: network access for user code is not allowed by this gateway (its "
                   "operator can open it with --allow network)")
    if tool.get("sandbox") is False and "unsandboxed_tools" not in allow:
        out.append(f"{name}.sandbox: a tool outside the sandbox is not allowed by this gateway (its operator can "
                   "open it with --allow unsandboxed_tools)")
    return out


#: The largest tool config file the gateway reads at submit, in bytes and in values.
TOOL_CONFIG_MAX_BYTES = 1 << 20
TOOL_CONFIG_MAX_VALUES = 100_000


def _more_values_than(node: Any, limit: int) -> bool:
    """Does ``node`` hold more than ``limit`` values (aliases counted each time they appear)?
    The walk stops as soon as the limit is passed."""
    stack, seen = [node], 0
    while stack:
        n = stack.pop()
        seen += 1
        if seen > limit:
            return True
        if isinstance(n, dict):
            stack.extend(n.keys())
            stack.extend(n.values())
        elif isinstance(n, list):
            stack.extend(n)
    return False
TOOL_CONFIG = "rollout.multi_turn.tool_config_path"


def inline_tool_config(spec: dict[str, Any], policy: OperatorPolicy,
                       excluded: Sequence[Path] = ()) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """Move the tools of ``rollout.multi_turn.tool_config_path`` into ``rollout.multi_turn.tools``
    (``spec`` changed in place and returned) and say what they ask for beyond the policy, each
    problem named ``rollout.multi_turn.tool_config_path: tools[i].<field>``.

    The file is a job input the client may have written, and a tool entry in it can ask for
    ``sandbox: false`` or ``allow_network``, which the spec alone cannot show. Once inlined, the
    job never reads the file: what it runs is what was checked here, whatever the file says
    later. A path that is no allowed input is left as it is (:func:`policy_problems` refuses it)."""
    path = _get(spec, TOOL_CONFIG)
    if not isinstance(path, str) or not path:
        return spec, []
    if _input_problems({"rollout": {"multi_turn": {"tool_config_path": path}}}, policy.input_roots, excluded):
        return spec, []
    try:
        with open(os.path.realpath(path), "rb") as fh:
            data = fh.read(TOOL_CONFIG_MAX_BYTES + 1)
        if len(data) > TOOL_CONFIG_MAX_BYTES:
            return spec, [f"{TOOL_CONFIG}: {path} is larger than {TOOL_CONFIG_MAX_BYTES} bytes"]
        raw = yaml.safe_load(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError, RecursionError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return spec, [f"{TOOL_CONFIG}: cannot read {path}: {why}"]
    if _more_values_than(raw, TOOL_CONFIG_MAX_VALUES):  # YAML aliases can make a small file expand exponentially
        return spec, [f"{TOOL_CONFIG}: {path} has more than {TOOL_CONFIG_MAX_VALUES} values once aliases are expanded"]
    items = raw.get("tools") if isinstance(raw, dict) else None
    if not isinstance(items, list):
        return spec, [f"{TOOL_CONFIG}: {path} has no `tools:` list"]
    problems = [p for i, item in enumerate(items)
                for p in _tool_problems(item, f"{TOOL_CONFIG}: tools[{i}]", policy.allow)]
    multi_turn = spec["rollout"]["multi_turn"]
    multi_turn["tools"] = [*(multi_turn.get("tools") or []), *items]
    multi_turn["tool_config_path"] = None
    return spec, problems


def _input_problems(spec: dict[str, Any], roots: Sequence[Path], excluded: Sequence[Path] = ()) -> list[str]:
    out: list[str] = []
    reward_model_on = bool(_get(spec, "reward.reward_model.enable"))
    shown_roots = ", ".join(str(r) for r in roots) or "none configured"
    for dotted, kind in INPUT_FIELDS:
        if dotted.startswith("reward.reward_model.") and not reward_model_on:
            continue
        for name, item in _values(spec, dotted):
            if not isinstance(item, str):
                continue  # the spec's own validation speaks about types
            if kind == "template" and not (item.endswith(".jinja") or item.startswith(("/", "~", "."))):
                continue  # template text, not a file
            if kind == "pyfile" and not item.endswith(".py"):
                if _MODULE.fullmatch(item):
                    continue  # an importable dotted module name (imported inside the sandbox)
                out.append(f"{name}: {item!r} is neither a .py file nor a dotted module name")
                continue
            p = Path(item).expanduser()
            if not p.is_absolute():
                out.append(f"{name}: relative path {item!r} (the job runs in its own run dir: give an absolute path)")
                continue
            real = Path(os.path.realpath(p))
            if not any(_inside(real, r) for r in roots):
                out.append(f"{name}: {item} is outside the gateway's input roots ({shown_roots})")
            elif any(_inside(real, x) for x in excluded):
                out.append(f"{name}: {item} is inside the gateway's runs dir (jobs' own files are no job's input)")
            elif not real.exists():
                out.append(f"{name}: {item} does not exist")
            elif kind == "dir" and not real.is_dir():
                out.append(f"{name}: {item} is not a directory")
            elif kind in ("file", "pyfile") and not real.is_file():
                out.append(f"{name}: {item} is not a file")
    return out


def _output_problems(spec: dict[str, Any], run_dir: Path) -> list[str]:
    out: list[str] = []
    base = Path(os.path.realpath(run_dir))
    for dotted in OUTPUT_FIELDS:
        for name, item in _values(spec, dotted):
            if not isinstance(item, str):
                continue
            p = Path(item).expanduser()
            target = Path(os.path.realpath(p if p.is_absolute() else base / p))
            if not _inside(target, base) or target == base:
                out.append(f"{name}: {item!r} is outside the job's run dir (outputs stay in it: give a relative "
                           "path without '..')")
    return out


def policy_problems(spec: dict[str, Any], policy: OperatorPolicy, run_dir: Path,
                    excluded: Sequence[Path] = ()) -> list[str]:  # fmt: skip
    """Every way the resolved ``spec`` asks for more than ``policy`` allows, one line each.
    ``excluded``: directories no input may come from even under an input root (the runs dir)."""
    excluded = [Path(os.path.realpath(x)) for x in excluded]
    return [*_capability_problems(spec, policy.allow), *_input_problems(spec, policy.input_roots, excluded),
            *_output_problems(spec, run_dir)]


__all__ = ["CAPABILITIES", "INPUT_FIELDS", "OUTPUT_FIELDS", "OperatorPolicy", "TOOL_CONFIG_MAX_BYTES",
           "inline_tool_config", "is_loopback", "policy_problems"]
