"""The tokenizer that turns prompts into token ids, without importing transformers when it can.

``from transformers import AutoTokenizer`` imports torch: ~3.5 s on a quiet machine, 10-20 s
while a job's trainer and reward worker import theirs on the same cores. The prompt feeder
(and the controller's validation set) only need two things of it: the chat template
rendered, and the rendered text encoded. Both can be done by the libraries transformers
itself uses for them: ``tokenizers`` (the Rust backend) and ``jinja2``.

What the backend is, though, is transformers' decision: a tokenizer class may rebuild it
(transformers 5 builds a ``qwen2`` model's tokenizer with its own normalizer and
pre-tokenizer, not the ones in ``tokenizer.json``), and the special-token variables and
the chat template come from several files in an order of precedence. So nothing here
re-derives that. The first time a tokenizer directory is used, transformers loads it as
always (:func:`load_prompt_tokenizer` returns it); once a prompt set was tokenized with it,
:func:`remember` checks that :class:`LightTokenizer` -- transformers' backend, serialized,
its chat template and its special tokens -- gives the very same ids for every one of those
prompts, and only then writes that into the cache. From then on, the same directory (the
same bytes of its tokenizer files, the same transformers and tokenizers versions: the
cache key) loads as a :class:`LightTokenizer` in milliseconds, without transformers.

Rendering follows ``transformers.utils.chat_template_utils`` exactly: an
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension and the ``{% generation %}`` tag, the ``tojson`` filter that does
not escape HTML, the ``raise_exception`` and ``strftime_now`` globals, and the tokenizer's
special tokens (``bos_token``, ``eos_token``, ...) as variables. Encoding is the backend's
``encode`` without special tokens, truncation or padding, as ``apply_chat_template`` calls
it (tests/unit/test_prompt_tokenizer.py compares both, token for token).

The cache is ``$MESHRL_CACHE_DIR/tokenizers`` (default ``~/.cache/meshrl/tokenizers``); a
file there that cannot be read is ignored (transformers loads the tokenizer instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMAT = 1
#: Files of a tokenizer directory that can change what transformers loads (the cache key).
KEY_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
             "chat_template.jinja", "chat_template.json", "config.json", "vocab.json", "merges.txt",
             "tokenizer.model", "spiece.model", "vocab.txt", "tekken.json")
#: The modules whose definitions of the methods transformers encodes with the light path
#: reproduces; a class (remote code, a model's own) that overrides one is never cached.
_BASE_MODULES = ("transformers.tokenization_utils_base", "transformers.tokenization_utils_tokenizers",
                 "transformers.tokenization_utils_fast")
_METHODS = ("__call__", "encode", "_encode_plus", "_batch_encode_plus", "apply_chat_template",
            "get_chat_template", "set_truncation_and_padding")


def cache_dir() -> Path:
    root = os.environ.get("MESHRL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "meshrl")
    return Path(root) / "tokenizers"


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def cache_key(path: str | Path, trust_remote_code: bool = False) -> str | None:
    """The cache key of the tokenizer in directory ``path``: its files' bytes, the versions
    of transformers and tokenizers. None when ``path`` is not a local directory (a hub name)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    h.update(json.dumps([FORMAT, _version("transformers"), _version("tokenizers"), bool(trust_remote_code)]).encode())
    names = [n for n in KEY_FILES if (p / n).is_file()]
    extra = p / "additional_chat_templates"
    if extra.is_dir():
        names += sorted(f"additional_chat_templates/{f.name}" for f in extra.iterdir() if f.is_file())
    for name in names:
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256((p / name).read_bytes()).digest())
    return h.hexdigest()


def _compile(template: str):
    """``template`` compiled as transformers compiles a chat template."""
    from datetime import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: its body, as is (transformers tracks the
        assistant's spans with it only when asked for an assistant mask, never here)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


class LightTokenizer:
    """What :mod:`services.data.prompts` needs of a tokenizer -- ``chat_template``,
    ``apply_chat_template`` and ``encode`` -- from a cache entry (see module doc)."""

    def __init__(self, entry: dict[str, Any], name_or_path: str = "") -> None:
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_str(entry["backend"])
        self.backend.no_truncation()
        self.backend.no_padding()
        self.backend.encode_special_tokens = bool(entry.get("split_special_tokens", False))
        self.chat_template = entry.get("chat_template")
        self.special_tokens_map = dict(entry.get("special_tokens_map") or {})
        self.name_or_path = name_or_path or entry.get("name_or_path", "")
        self._compiled: dict[str, Any] = {}

    def get_chat_template(self, chat_template: str | None = None) -> str:
        """As transformers' ``get_chat_template`` (without tools)."""
        own = self.chat_template
        if isinstance(own, dict):
            if chat_template is not None and chat_template in own:
                return own[chat_template]
            if chat_template is None:
                if "default" in own:
                    return own["default"]
                raise ValueError("This model has multiple chat templates with no default specified! Please either "
                                 "pass a chat template or the name of the template you wish to use to the "
                                 f"`chat_template` argument. Available template names are {sorted(own)}.")
        elif chat_template is None:
            if own is None:
                raise ValueError("Cannot use chat template functions because tokenizer.chat_template is not set "
                                 "and no template argument was passed!")
            return own
        return chat_template

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
               chat_template: str | None = None) -> str:
        template = self.get_chat_template(chat_template)
        compiled = self._compiled.get(template)
        if compiled is None:
            compiled = self._compiled[template] = _compile(template)
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **self.special_tokens_map)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
                            tokenize: bool = True, chat_template: str | None = None, **_: Any):
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        text = self.render(list(messages), add_generation_prompt=add_generation_prompt, chat_template=chat_template)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids


def read_cached(key: str | None, name_or_path: str = "") -> LightTokenizer | None:
    """The cached tokenizer of ``key``; None when there is none (or it cannot be read)."""
    if key is None:
        return None
    try:
        entry = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        if entry.get("format") != FORMAT:
            return None
        return LightTokenizer(entry, name_or_path)
    except Exception:  # noqa: BLE001 - an entry that does not read: transformers loads the tokenizer instead
        return None


def load_prompt_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> tuple[Any, str, str | None]:
    """``(tokenizer, how, key)``: the cached :class:`LightTokenizer` of ``path``
    (``how == "cached"``), else transformers' ``AutoTokenizer`` (``"transformers"``; pass it
    and ``key`` to :func:`remember` once it tokenized a prompt set)."""
    key = cache_key(path, trust_remote_code)
    light = read_cached(key, str(path))
    if light is not None:
        return light, "cached", key
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code), "transformers", key


def entry_of(tok: Any) -> dict[str, Any] | None:
    """The cache entry of a transformers tokenizer; None when the light path cannot stand for
    it (not a fast tokenizer, or a class that encodes or templates its own way)."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    if not isinstance(tok, PreTrainedTokenizerFast):
        return None
    for name in _METHODS:
        owner = next((c for c in type(tok).__mro__ if name in c.__dict__), None)
        if owner is not None and owner.__module__ not in _BASE_MODULES:
            return None
    template = tok.chat_template
    if not (template is None or isinstance(template, str)
            or (isinstance(template, dict) and all(isinstance(v, str) for v in template.values()))):
        return None
    special = dict(tok.special_tokens_map)
    if not all(isinstance(k, str) for k in special):
        return None
    return {"format": FORMAT, "backend": tok.backend_tokenizer.to_str(), "chat_template": template,
            "special_tokens_map": special, "split_special_tokens": bool(getattr(tok, "split_special_tokens", False)),
            "name_or_path": str(getattr(tok, "name_or_path", ""))}


def remember(tok: Any, key: str | None, check: Callable[[LightTokenizer], str | None]) -> str:
    """Cache transformers' tokenizer ``tok`` under ``key`` if ``check(light)`` -- the light
    tokenizer made of it gives the same ids as ``tok`` gave -- returns None (else the reason
    it did not). A line saying what happened."""
    if key is None:
        return "not a local directory: not cached"
    entry = entry_of(tok)
    if entry is None:
        return f"{type(tok).__name__} encodes or templates its own way: not cached"
    try:
        problem = check(LightTokenizer(entry))
    except Exception as exc:  # noqa: BLE001 - whatever the light path fails on, it is not used
        problem = f"{type(exc).__name__}: {exc}"
    if problem is not None:
        return f"not cached: the light tokenizer differs ({problem})"
    out = cache_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=out, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entry, f)
        os.replace(tmp, out / f"{key}.json")
    except OSError as exc:
        return f"not cached: {exc}"
    return f"cached as {out / key}.json"


def open_prompt_dataset(files: Any, tokenizer_path: str | Path, *, trust_remote_code: bool = False,
                        log: Callable[[str], None] = print, **dataset_kwargs: Any):
    """:class:`~services.data.prompts.PromptDataset` of ``files`` with the tokenizer of
    ``tokenizer_path`` (:func:`load_prompt_tokenizer`); where transformers loaded it, the
    light tokenizer is checked on these prompts and cached (:func:`remember`). Logs one line
    on the tokenizer, one on the cache."""
    from services.data.prompts import PromptDataset

    t0 = time.monotonic()
    tok, how, key = load_prompt_tokenizer(tokenizer_path, trust_remote_code=trust_remote_code)
    t1 = time.monotonic()
    ds = PromptDataset(files, tok, **dataset_kwargs)
    t2 = time.monotonic()
    log(f"tokenizer {tokenizer_path}: {how}, loaded in {t1 - t0:.2f}s; {len(ds)} prompts tokenized in {t2 - t1:.2f}s")
    if how == "transformers":
        log(f"tokenizer {tokenizer_path}: " + remember(tok, key, ds.differs) + f" ({time.monotonic() - t2:.2f}s)")
    return ds
