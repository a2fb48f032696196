"""``meshrl config``: every key of a job spec with its type, default and description
(the same as ``meshrl validate --schema``)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grep", default=None, help="only keys containing this text (e.g. val_kwargs)")


def run(args: argparse.Namespace) -> int:
    import sys

    from services.config.job import JobSpec
    from services.config.schema_doc import format_schema

    text = format_schema(JobSpec)
    if args.grep:
        text = "".join(line + "\n" for line in text.splitlines() if args.grep in line.split("  ", 1)[0])
        if not text:
            raise ValueError(f"no key contains {args.grep!r}")
    sys.stdout.write(text)
    return 0
