"""The repository stands alone: no tracked file points at design notes outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Built from pieces so this file does not match itself.
OUTSIDE = re.compile("|".join(re.escape(p) for p in ("../" + "shared", "shared" + "/", "STYLE" + ".md", "DESIGN" + ".md")))


def test_no_tracked_file_refers_outside_the_repository() -> None:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    hits, read = [], 0
    for name in names.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary files
        read += 1
        for lineno, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{lineno}: {line.strip()[:120]}")
    assert read > 200
    assert hits == [], "point to docs/architecture.md (or the docs/ page) instead:\n" + "\n".join(hits)
    assert (ROOT / "docs" / "architecture.md").is_file()
