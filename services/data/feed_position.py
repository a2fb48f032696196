"""The feeder's position file (``<run_dir>/feeder.json`` under ``meshrl run``, ``--state FILE``
elsewhere): how far a job's training prompts have been fed.

The feeder (``feeder_svc``) writes it after every put and resumes from it; the controller
reads it for the job's progress and, at the end, names every prompt fed from it alone
(:func:`fed_uids_of`) to audit the ledger. Layout::

    {"data": {"prompts": <rows>, "shuffle": <bool>, "seed": <int>, "job": <name>},
     "state": {"epoch": <int>, "cursor": <position in the epoch's order>, "fed": <prompts put, all epochs>}}
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.data.prompt_items import fed_uids


@dataclass
class FeedPosition:
    epoch: int = 0
    cursor: int = 0  # position in the epoch's order
    fed: int = 0  # prompts put so far (all epochs)


def read_position(path: str | Path) -> tuple[dict[str, Any], FeedPosition]:
    """``(data fingerprint, position)`` saved in ``path``; ValueError if unreadable."""
    try:
        saved = json.loads(Path(path).read_text())
        return dict(saved["data"]), FeedPosition(**saved["state"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"feeder state {path} is unreadable ({exc}); delete it to feed from the start") from None


def write_position(path: str | Path, data: dict[str, Any], position: FeedPosition) -> None:
    """Replace ``path`` atomically."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"data": data, "state": asdict(position)}))
    os.replace(tmp, path)


def fed_count(path: str | Path) -> int:
    """Prompts fed according to ``path``; 0 when there is no (readable) file yet."""
    try:
        return read_position(path)[1].fed
    except ValueError:
        return 0


def fed_uids_of(path: str | Path) -> list[str]:
    """The uid of every prompt fed according to ``path``, in feeding order."""
    data, pos = read_position(path)
    return list(fed_uids(data["job"], data["prompts"], pos.fed, shuffle=data["shuffle"], seed=data["seed"]))
