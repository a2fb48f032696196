"""Prompt datasets in verl's row schema, and meshrl's built-in synthetic tasks.

    synthetic.py  generators for `meshrl/arith` and `meshrl/countdown` (verl's row schema)
    parquet.py    the row schema; write verl-style parquet rows with pyarrow
    files.py      read rows from parquet, JSON lines, JSON and `datasets` save_to_disk dirs
    convert.py    GSM8K (question/answer, '#### N') and MATH (problem/solution, \\boxed{})
                  layouts -> verl rows (`meshrl make-dataset gsm8k|math --from FILE`)
    prompts.py    PromptDataset: chat template, tokenisation, over-long filtering/truncation
                  (verl's RLHFDataset semantics)
    prompt_items.py  the `prompts` stream's item layout, prompt uids, the data's order per epoch
    feed_position.py the feeder's position file (`feeder.json`): read, write, the uids fed
"""
