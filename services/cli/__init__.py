"""The ``meshrl`` command.

Parsing happens before any heavy import so ``meshrl --help`` is instant: each subcommand
lives in its own module and is imported only when it runs. To add one, append a
``Subcommand`` to ``SUBCOMMANDS`` and give its module ``add_arguments(parser)`` and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

from services import __version__


@dataclass(frozen=True)
class Subcommand:
    name: str
    module: str  # imported lazily; must define add_arguments(parser) and run(args)
    help: str


SUBCOMMANDS: list[Subcommand] = [
    Subcommand("demo", "services.cli.demo", "build a DataProto, send it through the wire format, print it"),
    Subcommand("quickstart", "services.cli.quickstart", "build the tiny model and task, warm-start, run GRPO (README's first command)"),
    Subcommand("run", "services.cli.run", "run a job on this machine (controller + all services as subprocesses)"),
    Subcommand("warm-start", "services.cli.warm_start", "a short supervised warm start (SFT) before RL"),
    Subcommand("validate", "services.cli.validate", "check a job spec and print it resolved (with a.b=c overrides)"),
    Subcommand("gateway", "services.cli.gateway", "serve the REST + gRPC control plane and the dashboard (jobs in SQLite/PostgreSQL)"),
    Subcommand("make-dataset", "services.cli.make_dataset", "write a built-in synthetic task (verl parquet format)"),
    Subcommand("make-tiny-model", "services.cli.make_tiny_model", "write the tiny Qwen2-style test model (local tokenizer, random weights)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrl",
        description="meshrl: asynchronous RL post-training of language models as a mesh of services.",
    )
    parser.add_argument("--version", action="version", version=f"meshrl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for sc in SUBCOMMANDS:
        p = sub.add_parser(sc.name, help=sc.help, description=sc.help)
        p.set_defaults(_module=sc.module)
        # Argument definitions are cheap modules by convention (no torch at import).
        importlib.import_module(sc.module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
