"""Read prompt rows from the file layouts people have: parquet, JSON lines, JSON, and
``datasets`` directories written by ``Dataset.save_to_disk``.

    rows = read_rows(["train.parquet", "more.jsonl", "saved_dataset_dir/"])

Every source yields the same row dicts (verl's schema, see :mod:`services.data.parquet`),
checked for the required columns. A ``datasets`` directory is read with pyarrow from its
Arrow files (the ``datasets`` package is not needed); a ``DatasetDict`` directory must be
given with its split (``dir/train``). ``extra_info`` stored as a JSON string is decoded;
a plain-string ``prompt`` is kept as is (:class:`~services.data.prompts.PromptDataset`
makes it a user message).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")
FORMATS = "parquet (.parquet), JSON lines (.jsonl), JSON (.json: a list of rows), or a datasets save_to_disk directory"


class DataFileError(ValueError):
    """A data file cannot be read as prompt rows; the message names the file and the problem."""


def _parquet(p: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(p).to_pylist()


def _jsonl(p: Path) -> list[dict[str, Any]]:
    rows = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(f"{p}:{n}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{p}:{n}: a row must be a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _json(p: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return _jsonl(p)  # many ".json" files are JSON lines
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataFileError(f"{p}: expected a JSON list of row objects (or JSON lines)")
    return data


def _saved_dataset(p: Path) -> list[dict[str, Any]]:
    """A ``datasets.Dataset.save_to_disk`` directory: ``state.json`` lists its Arrow files
    (Arrow IPC streams)."""
    import pyarrow as pa

    if (p / "dataset_dict.json").exists():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        raise DataFileError(f"{p} is a DatasetDict; give one split's directory, e.g. "
                            + " or ".join(str(p / s) for s in splits[:3]))
    state = json.loads((p / "state.json").read_text())
    files = [p / f["filename"] for f in state.get("_data_files", [])]
    if not files:
        raise DataFileError(f"{p}/state.json lists no data files")
    rows: list[dict[str, Any]] = []
    for f in files:
        with pa.memory_map(str(f)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(source).read_all()
        rows += table.to_pylist()
    indices = state.get("_indices_data_files")
    if indices:  # a shuffled/selected view: rows in the order its indices file says
        order: list[int] = []
        for f in indices:
            with pa.memory_map(str(p / f["filename"])) as source:
                order += pa.ipc.open_stream(source).read_all().column("indices").to_pylist()
        rows = [rows[i] for i in order]
    return rows


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The raw records of one file or saved dataset directory (no schema check)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataFileError(f"{p}: no such file or directory")
    try:
        if p.is_dir():
            if (p / "state.json").exists() or (p / "dataset_dict.json").exists():
                return _saved_dataset(p)
            raise DataFileError(f"{p} is a directory but not a datasets save_to_disk directory (no state.json); "
                                f"expected {FORMATS}")
        suffix = "".join(p.suffixes[-1:]).lower()
        if suffix == ".parquet":
            return _parquet(p)
        if suffix == ".jsonl":
            return _jsonl(p)
        if suffix == ".json":
            return _json(p)
    except DataFileError:
        raise
    except (OSError, ValueError) as exc:
        raise DataFileError(f"{p}: cannot read it ({exc})") from None
    raise DataFileError(f"{p}: unknown format {suffix or '(no suffix)'}; expected {FORMATS}")


def _decode_extra(path: Path, row: dict[str, Any]) -> None:
    extra = row.get("extra_info")
    if isinstance(extra, str):
        try:
            row["extra_info"] = json.loads(extra)
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{path}: extra_info is not valid JSON: {exc}") from None


def read_rows(paths: str | Path | Sequence[str | Path], required: Iterable[str] = REQUIRED_COLUMNS) -> list[dict[str, Any]]:
    """Rows of one or more files in any supported format, each checked for ``required``."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        got = read_records(p)
        if not got:
            raise DataFileError(f"{p}: no rows")
        for i, r in enumerate(got):
            missing = [c for c in required if c not in r]
            if missing:
                raise DataFileError(f"{p}: row {i} lacks required column(s) {missing}; it has {sorted(r)} "
                                    "(convert it with `meshrl make-dataset gsm8k|math --from FILE`)")
            _decode_extra(p, r)
        rows += got
    return rows
