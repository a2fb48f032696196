"""verl's dataset row schema on disk: one parquet row per prompt.

Columns (as verl's preprocessing scripts write them):
    data_source   str                       which scorer applies, e.g. "openai/gsm8k", "meshrl/arith"
    prompt        list[{"role", "content"}]  chat messages; the chat template is applied at load time
    ability       str                       free-form task family, e.g. "math"
    reward_model  {"style": str, "ground_truth": str}
    extra_info    dict                      anything else (split, index, task parameters)

Reading (parquet and the other formats) is :func:`services.data.files.read_rows`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write verl-style rows to a parquet file. ``extra_info`` is stored as a JSON string
    column when its dicts differ in shape, so any per-row mapping survives."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not rows:
        raise ValueError(f"refusing to write an empty dataset to {path}")
    cols: dict[str, list] = {k: [] for k in rows[0]}
    for i, r in enumerate(rows):
        if set(r) != set(cols):
            raise ValueError(f"row {i} has columns {sorted(r)}, expected {sorted(cols)}")
        for k, v in r.items():
            cols[k].append(json.dumps(v, sort_keys=True) if k == "extra_info" else v)
    pq.write_table(pa.table(cols), path)
    return path
