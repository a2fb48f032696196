"""Check that a job's input files exist and can be read, before anything starts.

``meshrl validate`` and ``meshrl run`` call :func:`check_inputs`; each problem is one
line ``<dotted.path>: <what is wrong> (<what to do>)``:

* ``model.path`` / ``model.tokenizer_path``: a local directory with a readable
  ``config.json`` (``tiny:DIR`` builds the tiny model on demand and passes; a name that is
  no local path is accepted only when it looks like a hub id, ``org/name``, since meshrl
  never downloads by itself);
* ``data.train_files`` / ``data.val_files``: each readable with the columns prompts need
  (a parquet file down to every row group's data; other formats are read whole);
* ``reward.custom_reward_function.path``: the file exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from services.data.files import REQUIRED_COLUMNS


def _check_model_dir(key: str, value: str) -> list[str]:
    if value.startswith("tiny:"):
        return []
    p = Path(value).expanduser()
    if not p.exists():
        if not value.startswith(("/", ".", "~")) and value.count("/") == 1:
            return []  # a hub id: resolved (and checked) by the services themselves
        return [f"{key}: {value} does not exist (build one with `meshrl make-tiny-model DIR` or fix the path)"]
    if not p.is_dir():
        return [f"{key}: {value} is not a directory (point it at a HuggingFace model directory)"]
    cfg = p / "config.json"
    try:
        json.loads(cfg.read_text())
    except FileNotFoundError:
        return [f"{key}: {value} has no config.json (not a HuggingFace model directory)"]
    except (OSError, ValueError) as exc:
        return [f"{key}: {cfg} is unreadable: {str(exc).splitlines()[0]}"]
    return []


def _check_data(key: str, path: str, prompt_key: str) -> list[str]:
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.exists():
        return [f"{key}: {path} does not exist (fix the path, or make data with `meshrl make-dataset`)"]
    if p.suffix != ".parquet":  # JSON lines, JSON, a datasets directory: read it whole
        from services.data.files import read_rows

        try:
            rows = read_rows([p])
        except Exception as exc:  # noqa: BLE001 - any read failure is the one-line reason
            return [f"{key}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
        if not rows:
            return [f"{key}: {path} has no rows"]
        if prompt_key not in rows[0]:
            return [f"{key}: {path} lacks column {prompt_key!r} (data.prompt_key)"]
        return []
    try:
        f = pq.ParquetFile(p)
        names = f.schema_arrow.names
        for i in range(f.num_row_groups):  # reads every page: a corrupt body fails here, not mid-run
            f.read_row_group(i)
    except Exception as exc:  # noqa: BLE001 - any read failure is the one-line reason
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [f"{key}: {path} is not a readable parquet file ({reason})"]
    missing = [c for c in (*REQUIRED_COLUMNS, prompt_key) if c not in names]
    if missing:
        return [f"{key}: {path} lacks column(s) {sorted(set(missing))} (has {names})"]
    if f.metadata.num_rows == 0:
        return [f"{key}: {path} has no rows"]
    return []


def check_inputs(spec: Any) -> list[str]:
    """Problems with the files ``spec`` (a JobSpec) names; [] when all can be read."""
    problems = _check_model_dir("model.path", spec.model.path)
    if spec.model.tokenizer_path:
        problems += _check_model_dir("model.tokenizer_path", spec.model.tokenizer_path)
    fn = spec.reward.custom_reward_function.path
    if fn and not Path(fn).expanduser().is_file():
        problems.append(f"reward.custom_reward_function.path: {fn} does not exist (fix the path or drop the key)")
    for key in ("train_files", "val_files"):
        for i, path in enumerate(getattr(spec.data, key)):
            problems += _check_data(f"data.{key}[{i}]", path, spec.data.prompt_key)
    return problems
