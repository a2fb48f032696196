"""Prompt datasets in verl's parquet format, and meshrl's built-in synthetic tasks.

    synthetic.py  generators for `meshrl/arith` and `meshrl/countdown` (verl's row schema)
    parquet.py    read/write verl-style parquet rows with pyarrow
    prompts.py    PromptDataset: chat template, tokenisation, over-long filtering/truncation
                  (verl's RLHFDataset semantics)
"""
