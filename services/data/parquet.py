"""verl's dataset row schema on disk: one parquet row per prompt.

Columns (as verl's preprocessing scripts write them):
    data_source   str                       which scorer applies, e.g. "openai/gsm8k", "meshrl/arith"
    prompt        list[{"role", "content"}]  chat messages; the chat template is applied at load time
    ability       str                       free-form task family, e.g. "math"
    reward_model  {"style": str, "ground_truth": str}
    extra_info    dict                      anything else (split, index, task parameters)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")


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


def read_rows(paths: str | Path | Sequence[str | Path]) -> list[dict[str, Any]]:
    """Read one or more verl-style parquet files into a list of row dicts."""
    import pyarrow.parquet as pq

    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for p in paths:
        table = pq.read_table(p)
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{p}: missing required column(s) {missing}; has {table.column_names}")
        for r in table.to_pylist():
            extra = r.get("extra_info")
            if isinstance(extra, str):
                try:
                    r["extra_info"] = json.loads(extra)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{p}: extra_info is not valid JSON: {exc}") from None
            rows.append(r)
    return rows
