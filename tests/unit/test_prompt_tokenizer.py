"""services/data/prompt_tokenizer.py: the light tokenizer (``tokenizers`` + ``jinja2``, no
transformers) gives the ids transformers' ``apply_chat_template`` gives, token for token, and
it is cached only once checked so."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from services.data.prompt_tokenizer import (LightTokenizer, cache_key, entry_of, load_prompt_tokenizer,
                                            open_prompt_dataset, remember)

ROOT = Path(__file__).resolve().parents[2]

CONVERSATIONS = [
    [{"role": "user", "content": "12+3="}],
    [{"role": "user", "content": "What is 4 + 4? Put the answer in \\boxed{}."}],
    [{"role": "system", "content": "You are a careful calculator."},
     {"role": "user", "content": "Compute 123 * 45.\nShow   your work  "},
     {"role": "assistant", "content": "123 * 45 = 5535\n#### 5535"},
     {"role": "user", "content": "And 7-9?"}],
    [{"role": "user", "content": "text with <|im_end|> and <|im_start|>user inside, <b>html</b> & 'quotes' \"x\""}],
    [{"role": "user", "content": "unicode: héllo wörld — ünïcödé ∑ 你好 🙂\ttabs\r\nCRLF"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "   leading and trailing spaces   "}],
]

#: A template with what chat templates use: system/user/assistant branches, the special-token
#: variables, raise_exception, loop controls, tojson, the {% generation %} tag, trim/lstrip.
CUSTOM_TEMPLATE = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}{% set rest = messages[1:] %}
{% else %}
    {% set system = 'Default system prompt.' %}{% set rest = messages %}
{% endif %}
<|im_start|>system
{{ system }}<|im_end|>
{% for m in rest %}
    {% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}
    {% if m['content'] == 'SKIP' %}{% continue %}{% endif %}
    {% if m['role'] == 'assistant' %}
<|im_start|>assistant
{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}

    {% else %}
<|im_start|>{{ m['role'] }}
{{ m['content'] }} {{ {'n': loop.index, 'html': '<&>'} | tojson }}<|im_end|>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}{{ pad_token }}"""


def _hf_ids(tok, messages, *, add_generation_prompt=True, chat_template=None) -> list[int]:
    ids = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                  chat_template=chat_template)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def _assert_same(tok, light: LightTokenizer) -> None:
    for template in (None, CUSTOM_TEMPLATE):
        for conv in CONVERSATIONS + [CONVERSATIONS[2][:1] + [{"role": "user", "content": "SKIP"}, *CONVERSATIONS[0]]]:
            for gen in (True, False):
                want = _hf_ids(tok, conv, add_generation_prompt=gen, chat_template=template)
                got = light.apply_chat_template(conv, add_generation_prompt=gen, chat_template=template)
                assert got == want, (template is not None, conv, gen)
                text = tok.apply_chat_template(conv, add_generation_prompt=gen, tokenize=False,
                                               chat_template=template)
                assert light.apply_chat_template(conv, add_generation_prompt=gen, tokenize=False,
                                                 chat_template=template) == text
    for conv in CONVERSATIONS:
        text = conv[-1]["content"]
        assert light.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    bad = [{"role": "tool", "content": "x"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role tool"):
        tok.apply_chat_template(bad, chat_template=CUSTOM_TEMPLATE, tokenize=False)
    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role tool"):
        light.apply_chat_template(bad, chat_template=CUSTOM_TEMPLATE, tokenize=False)


def test_light_tokenizer_equals_transformers_on_the_tiny_model(tiny_model: str) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    entry = entry_of(tok)
    assert entry is not None
    light = LightTokenizer(json.loads(json.dumps(entry)))  # as read back from the cache file
    _assert_same(tok, light)


def test_light_tokenizer_equals_transformers_on_smollm2(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct's tokenizer (a ChatML template with a default system prompt, a
    49,152-token BPE), as ``meshrl make-model`` writes it, when its GGUF is installed."""
    pytest.importorskip("gguf")
    from services.modelling.gguf import known_gguf
    from services.modelling.hf_dir import embed_chat_template

    try:
        src = known_gguf("smollm2-135m-instruct")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "smollm2"
    gguf_tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    gguf_tok.save_pretrained(out)
    if gguf_tok.chat_template:
        embed_chat_template(out, gguf_tok.chat_template)
    AutoConfig.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    entry = entry_of(tok)
    assert entry is not None
    _assert_same(tok, LightTokenizer(json.loads(json.dumps(entry))))


def _rows(path: Path, prompts: list) -> Path:
    path.write_text("".join(json.dumps({"data_source": "t", "prompt": p, "reward_model": {"style": "rule",
                                        "ground_truth": "1"}}) + "\n" for p in prompts))
    return path


def test_open_prompt_dataset_caches_once_checked_then_loads_without_transformers(tiny_model: str, tmp_path: Path,
                                                                                monkeypatch) -> None:
    monkeypatch.setenv("MESHRL_CACHE_DIR", str(tmp_path / "cache"))
    prompts = [c for c in CONVERSATIONS] + [f"{a}+{b}=" for a in range(30) for b in range(7)] + ["9" * 200]
    data = _rows(tmp_path / "train.jsonl", prompts)
    lines: list[str] = []
    kw = dict(max_prompt_length=40, truncation="error", filter_overlong_prompts=True)
    first = open_prompt_dataset(data, tiny_model, log=lines.append, **kw)
    assert "transformers" in lines[0] and "cached as" in lines[1], lines
    assert first.num_filtered >= 1
    lines.clear()
    second = open_prompt_dataset(data, tiny_model, log=lines.append, **kw)
    assert ": cached," in lines[0] and len(lines) == 1, lines
    assert isinstance(second.tokenizer, LightTokenizer)
    assert len(second) == len(first) and second.num_filtered == first.num_filtered
    assert [second[i] for i in range(len(second))] == [first[i] for i in range(len(first))]

    # a fresh process reads the cache: no transformers, no torch
    code = ("import sys, json; from services.data.prompt_tokenizer import open_prompt_dataset; "
            f"ds = open_prompt_dataset({str(data)!r}, {tiny_model!r}, log=lambda l: None, max_prompt_length=40); "
            "print(json.dumps([len(ds), 'transformers' in sys.modules, 'torch' in sys.modules, ds[0]['raw_prompt_ids']]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "MESHRL_CACHE_DIR": str(tmp_path / "cache")})
    n, has_tf, has_torch, ids = json.loads(out.stdout.strip().splitlines()[-1])
    assert (n, has_tf, has_torch, ids) == (len(first), False, False, first[0]["raw_prompt_ids"])


def test_the_key_follows_the_tokenizer_files(tiny_model: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MESHRL_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns("*.safetensors"))
    key = cache_key(model)
    assert key == cache_key(model) and cache_key(tmp_path / "no-such-dir") is None
    tok, how, k = load_prompt_tokenizer(model)
    assert (how, k) == ("transformers", key)
    assert remember(tok, key, lambda light: None).startswith("cached as")
    assert load_prompt_tokenizer(model)[1] == "cached"
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert cache_key(model) != key
    tok2, how2, _ = load_prompt_tokenizer(model)
    assert how2 == "transformers"  # the edited template is transformers' again until checked and cached
    assert _hf_ids(tok2, CONVERSATIONS[0]) != _hf_ids(tok, CONVERSATIONS[0])


def test_a_light_tokenizer_that_differs_is_not_cached(tiny_model: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MESHRL_CACHE_DIR", str(tmp_path / "cache"))
    tok, _, key = load_prompt_tokenizer(tiny_model)
    assert "differs (prompt 3" in remember(tok, key, lambda light: "prompt 3: 5 ids against 6")

    def boom(light):
        raise jinja2.exceptions.TemplateError("nope")

    assert "TemplateError: nope" in remember(tok, key, boom)
    assert load_prompt_tokenizer(tiny_model)[1] == "transformers"
    (tmp_path / "cache" / "tokenizers").mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache" / "tokenizers" / f"{key}.json").write_text("{not json")
    assert load_prompt_tokenizer(tiny_model)[1] == "transformers"  # an unreadable entry is ignored
