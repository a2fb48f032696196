"""Tool-call parsers: the text of one model turn -> the tool calls it makes.

A parser never raises on what the model wrote. It returns a :class:`ParsedTurn`: the
well-formed calls, and one :class:`CallError` per malformed one (bad JSON, no name,
arguments that are not an object), which the agent loop turns into an error observation
so the model sees what it got wrong and the trajectory goes on.

Built in, selected by ``rollout.multi_turn.format``:

``hermes`` (default; Qwen2.5/Qwen3, Hermes): each call is
    ``<tool_call>{"name": "calc", "arguments": {"expr": "2+3"}}</tool_call>``
``openai``: OpenAI function-calling JSON anywhere in the turn: an object with
    ``tool_calls: [{"type": "function", "function": {"name", "arguments"}}]`` (arguments may
    be a JSON string, as the OpenAI API sends them), a single ``{"name", "arguments"}``
    object, or a list of them.

Anything else is the dotted path of a :class:`ToolCallParser` subclass (pluggable).
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from services.registry import TOOL_PARSERS


@dataclass
class ToolCall:
    """One well-formed call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallError:
    """A call the model attempted but wrote wrongly (the loop answers it with an error)."""

    message: str
    raw: str = ""


@dataclass
class ParsedTurn:
    """What one model turn asked for: ``content`` is the text outside the calls."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[CallError] = field(default_factory=list)

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


class ToolCallParser:
    """Base class: override :meth:`parse`. Must not raise on any input text."""

    #: tokens/strings the parser relies on (documentation only)
    name = "base"

    def parse(self, text: str) -> ParsedTurn:  # pragma: no cover - interface
        raise NotImplementedError


def _call_from_obj(obj: Any, raw: str) -> ToolCall | CallError:
    """``{"name": str, "arguments": dict | json-string}`` (or OpenAI's ``{"function": {...}}``)."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict):
        return CallError(f"a tool call must be a JSON object, got {type(obj).__name__}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return CallError("a tool call needs a non-empty string 'name'", raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return CallError(f"arguments of {name!r} are not valid JSON: {exc.msg}", raw)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return CallError(f"arguments of {name!r} must be a JSON object, got {type(args).__name__}", raw)
    return ToolCall(name=name.strip(), arguments=args)


class HermesParser(ToolCallParser):
    """``<tool_call>{json}</tool_call>`` blocks (an unclosed last block counts too)."""

    name = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[CallError] = []
        for m in self._BLOCK.finditer(text):
            raw = m.group(1).strip()
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                errors.append(CallError(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})", raw[:200]))
                continue
            except RecursionError:
                errors.append(CallError("tool call JSON is nested too deeply", raw[:200]))
                continue
            got = _call_from_obj(obj, raw[:200])
            (calls if isinstance(got, ToolCall) else errors).append(got)
        content = self._BLOCK.sub("", text).strip()
        return ParsedTurn(content=content, calls=calls, errors=errors)


class OpenAIParser(ToolCallParser):
    """OpenAI function-calling JSON (see the module docstring)."""

    name = "openai"

    @staticmethod
    def _json_spans(text: str):
        """Top-level JSON objects/arrays in ``text`` (balanced brackets outside strings)."""
        dec = json.JSONDecoder()
        i = 0
        while i < len(text):
            if text[i] in "{[":
                try:
                    obj, end = dec.raw_decode(text, i)
                except (json.JSONDecodeError, RecursionError):
                    i += 1
                    continue
                yield i, end, obj
                i = end
            else:
                i += 1

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[CallError] = []
        kept: list[str] = []
        pos = 0
        for start, end, obj in self._json_spans(text):
            items = None
            if isinstance(obj, dict) and "tool_calls" in obj:
                items = obj["tool_calls"] if isinstance(obj["tool_calls"], list) else [obj["tool_calls"]]
            elif isinstance(obj, dict) and ("name" in obj or "function" in obj):
                items = [obj]
            elif isinstance(obj, list) and obj and all(isinstance(o, dict) and ("name" in o or "function" in o) for o in obj):
                items = obj
            if items is None:
                continue
            kept.append(text[pos:start])
            pos = end
            for it in items:
                got = _call_from_obj(it, json.dumps(it)[:200] if _jsonable(it) else "")
                (calls if isinstance(got, ToolCall) else errors).append(got)
        kept.append(text[pos:])
        if not calls and not errors and '"tool_calls"' in text:
            errors.append(CallError("tool_calls JSON could not be parsed", text[-200:]))
        return ParsedTurn(content="".join(kept).strip(), calls=calls, errors=errors)


def _jsonable(obj: Any) -> bool:
    try:
        json.dumps(obj)
        return True
    except (TypeError, ValueError):
        return False


BUILTIN_PARSERS: dict[str, type[ToolCallParser]] = {"hermes": HermesParser, "openai": OpenAIParser}
TOOL_PARSERS.attach(lambda: BUILTIN_PARSERS)  # so the job spec's checks know what is added here


def get_parser(spec: str) -> ToolCallParser:
    """A parser by built-in name or dotted class path (ValueError naming the problem)."""
    if spec in BUILTIN_PARSERS:
        return BUILTIN_PARSERS[spec]()
    mod_name, _, cls_name = spec.rpartition(".")
    if not mod_name:
        raise ValueError(
            f"rollout.multi_turn.format: unknown parser {spec!r} (use {sorted(BUILTIN_PARSERS)} or a dotted class path)"
        )
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"rollout.multi_turn.format: cannot import {spec!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, ToolCallParser)):
        raise ValueError(f"rollout.multi_turn.format: {spec!r} is not a ToolCallParser subclass")
    return cls()
