"""Build a tiny Qwen2-style causal LM directory for tests, benchmarks and the quick start.

``build_tiny_model(out_dir)`` writes a complete HuggingFace model directory, made entirely on
this machine (nothing is downloaded):

- ``config.json``: a ``Qwen2ForCausalLM`` config (default hidden 128, 2 layers, 4 query heads,
  2 KV heads, head_dim 32 -- a size the vLLM CPU attention backend supports --, tied
  embeddings, vocab padded to a multiple of 64; about 0.45M parameters);
- ``model.safetensors``: float32 weights drawn from a seeded generator (same seed -> same
  bytes);
- a byte-level BPE tokenizer trained with ``tokenizers`` on a small built-in corpus covering
  digits, arithmetic, letters, punctuation, ``####`` and ``\\boxed{}``; special tokens
  ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) as in Qwen2-Instruct;
- ``spec.added_tokens`` (default none) as extra single tokens, e.g. the tool-use example's
  ``<tool_call>`` and the fixed part of its call;
- ``tokenizer_config.json`` with a Qwen-style chat template, and ``generation_config.json``.

The directory loads with ``transformers.AutoModelForCausalLM/AutoTokenizer.from_pretrained``
and with ``vllm.LLM(model=dir, dtype="float32")``. Only tools import this module
(``meshrl make-tiny-model``, the quick start, tests, benchmarks): the services load a model
directory that exists already, whoever built it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from services.modelling.hf_dir import embed_chat_template

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

#: Qwen-style chat template: ``<|im_start|>role\ncontent<|im_end|>\n`` per message, with
#: ``<|im_start|>assistant\n`` appended when ``add_generation_prompt`` is true.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = (
    "the a an of to and is are was what how many much total each sum product difference "
    "answer question solve compute find if then so there were has have had left more less "
    "apples books coins cats dogs students friends minutes hours days pages dollars cents "
    "Natalia sold clips in April May half as altogether Weng earns hour babysitting "
    "system user assistant You are a helpful Let think step by step final Please put your "
    "within The is therefore Answer Step equals plus minus times divided "
)


def _corpus() -> list[str]:
    """A small deterministic training corpus for the tokenizer (list of lines)."""
    lines = [_WORDS, _WORDS.upper(), "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    lines.append("0123456789 + - * / = ( ) [ ] { } < > . , ; : ! ? ' \" % $ # & _ ^ ~ | \\ @ `")
    for a in range(0, 100, 7):
        for b in range(1, 60, 11):
            lines.append(f"{a} + {b} = {a + b}. {a} - {b} = {a - b}. {a} * {b} = {a * b}. ({a}+{b})/{b}")
            lines.append(f"The answer is {a + b}.\n#### {a + b}")
            lines.append(f"So the final answer is \\boxed{{{a * b}}}.")
    lines.append("<think> </think> <answer> </answer>")
    return lines


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model. Defaults give ~0.45M float32 parameters.

    hidden_size / num_attention_heads must be a head size vLLM's CPU attention supports
    (32, 64, 80, ...); num_attention_heads must be a multiple of num_key_value_heads.
    """

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    tokenizer_vocab: int = 500  # BPE target size incl. the 256 byte symbols and special tokens
    tie_word_embeddings: bool = True
    init_std: float = 0.02
    seed: int = 0
    #: strings that become single (non-special) tokens, matched before BPE, as Qwen's
    #: ``<tool_call>``; they survive ``skip_special_tokens`` decoding
    added_tokens: tuple[str, ...] = ()


def build_tokenizer(spec: TinyModelSpec):
    """Train a byte-level BPE (``tokenizers.Tokenizer``) on the built-in corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.tokenizer_vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write the tiny model directory to ``out_dir`` (created if missing); returns the path.

    Deterministic: the same ``spec`` writes the same tokenizer and the same weights.
    """
    if Path(out_dir).exists() and any(Path(out_dir).iterdir()) and not (Path(out_dir) / "meshrl_tiny.json").exists():
        raise FileExistsError(f"{out_dir} exists and is not a meshrl tiny model directory; refusing to overwrite")
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    raw_tok = build_tokenizer(spec)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw_tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=spec.max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    if spec.added_tokens:
        tokenizer.add_tokens(list(spec.added_tokens))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    embed_chat_template(out, CHAT_TEMPLATE)

    n_tok = len(tokenizer)
    vocab = ((n_tok + 63) // 64) * 64
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        initializer_range=spec.init_std,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
        dtype="float32",
    )
    config.architectures = ["Qwen2ForCausalLM"]
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * spec.init_std)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-shard bar for a 2 MB file is noise
    model.save_pretrained(out, safe_serialization=True)
    (out / "meshrl_tiny.json").write_text(json.dumps({"spec": asdict(spec), "tokens": n_tok}, indent=1))
    return out
