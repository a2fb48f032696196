"""Every key of a config model, with its type, default and description (``meshrl validate
--schema``, ``meshrl config``).

    for row in schema_rows(JobSpec):
        print(row.key, row.type, row.default, row.description)

Nested blocks are walked; a block that is one of several models (e.g. ``queues``: embedded
or redis) lists each variant's keys with the variant named (``queues.url [type=redis]``);
list items are shown as ``key[].sub``.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class SchemaRow:
    key: str
    type: str
    default: str
    description: str


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def type_name(tp: Any) -> str:
    """A short readable name of a type annotation."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Literal:
        return "|".join(json.dumps(a) if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (list, tuple, set, frozenset):
        return f"list[{', '.join(type_name(a) for a in args if a is not Ellipsis)}]"
    if origin is dict:
        return f"dict[{', '.join(type_name(a) for a in args)}]" if args else "dict"
    if _is_model(tp):
        return "block"
    return getattr(tp, "__name__", str(tp))


def _default_value(field: Any) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        try:
            return field.default_factory()
        except TypeError:
            return None
    return None


def _default(field: Any, given: Any = PydanticUndefined) -> str:
    if given is not PydanticUndefined:
        value = given
    elif field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory taking the validated data
            return "(computed)"
    else:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(block)"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """Model classes a field holds directly, in a union, or as list items."""
    if _is_model(tp):
        return [tp]
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _models_in(a)]
    return []


def _list_item_models(tp: Any) -> list[type[BaseModel]]:
    if typing.get_origin(tp) in (list, tuple):
        return [m for a in typing.get_args(tp) for m in _models_in(a)]
    return []


def _variant(model: type[BaseModel]) -> str:
    t = model.model_fields.get("type")
    if t is not None and typing.get_origin(t.annotation) is typing.Literal:
        return f"type={typing.get_args(t.annotation)[0]}"
    return model.__name__


def schema_rows(model: type[BaseModel], prefix: str = "", note: str = "", instance: Any = None) -> list[SchemaRow]:
    """Rows of ``model``'s keys; ``instance`` (the block's default, when it has one) supplies
    the defaults of its keys where they differ from the class's own."""
    rows: list[SchemaRow] = []
    for name, field in model.model_fields.items():
        given = getattr(instance, name) if isinstance(instance, model) else PydanticUndefined
        key = prefix + (field.alias or name)
        desc = (field.description or "").strip()
        sub = _models_in(field.annotation)
        items = _list_item_models(field.annotation)
        tag = f" [{note}]" if note else ""
        if sub:
            rows.append(SchemaRow(key + tag, type_name(field.annotation), _default(field, given), desc))
            inst = given if given is not PydanticUndefined else _default_value(field)
            for m in sub:
                rows += schema_rows(m, key + ".", _variant(m) if len(sub) > 1 else note, inst)
        elif items:
            rows.append(SchemaRow(key + tag, "list", _default(field, given), desc))
            for m in items:
                rows += schema_rows(m, key + "[].", note)
        else:
            rows.append(SchemaRow(key + tag, type_name(field.annotation), _default(field, given), desc))
    return rows


def format_schema(model: type[BaseModel]) -> str:
    """One key per line: ``key  type  = default  description`` (aligned)."""
    rows = schema_rows(model)
    kw = min(48, max(len(r.key) for r in rows))
    tw = min(32, max(len(r.type) for r in rows))
    out = []
    for r in rows:
        out.append(f"{r.key:<{kw}}  {r.type:<{tw}}  = {r.default:<10}  {r.description}".rstrip())
    return "\n".join(out) + "\n"


def keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The key names allowed in the block at ``loc`` (a path of keys below ``model``);
    [] when the path does not lead to a block."""
    blocks: list[type[BaseModel]] = [model]
    for part in loc:
        nxt: list[type[BaseModel]] = []
        for b in blocks:
            for name, field in b.model_fields.items():
                if part in (name, field.alias):
                    nxt += _models_in(field.annotation) + _list_item_models(field.annotation)
        if isinstance(part, int):  # a list index: stay on the item models found before
            continue
        if not nxt:  # a union's tag in the error location (queues.embedded.x): pick that variant
            nxt = [b for b in blocks if _variant(b) == f"type={part}"]
        blocks = nxt
        if not blocks:
            return []
    return sorted({f.alias or n for b in blocks for n, f in b.model_fields.items()})


def unknown_key_message(model: type[BaseModel], loc: tuple) -> str:
    """``unknown key (did you mean 'x'?; `meshrl config` lists every key)`` for ``loc``."""
    import difflib

    known = keys_at(model, tuple(p for p in loc[:-1] if not isinstance(p, int)))
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6) if known else []
    hint = f"did you mean {close[0]!r}?; " if close else ""
    return f"unknown key ({hint}`meshrl config` lists every key)"
