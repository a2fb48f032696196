"""``meshrl gateway``: serve the REST + gRPC control plane (see docs/gateway.md).

The token comes from ``--token-file`` or the ``MESHRL_GATEWAY_TOKEN`` environment variable;
the database from ``--db`` or ``MESHRL_GATEWAY_DB`` (default: SQLite in the runs dir).
"""

from __future__ import annotations

import argparse
import os
import sys

from gateway_svc.launchers.registry import LAUNCHERS

DEFAULT_HTTP_PORT = 8600  # kept equal to gateway_svc.server.DEFAULT_HTTP_PORT (a test checks)
DEFAULT_GRPC_PORT = 8601


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=os.environ.get("MESHRL_GATEWAY_HOST", "127.0.0.1"), help="bind address")
    p.add_argument("--port", type=int, default=DEFAULT_HTTP_PORT, help="REST port (default %(default)s)")
    p.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT, help="JobService port; -1 disables it")
    p.add_argument("--db", default=os.environ.get("MESHRL_GATEWAY_DB"), help="sqlite:///PATH or postgresql://URL")
    p.add_argument("--runs-dir", default=os.environ.get("MESHRL_RUNS_DIR", "runs"), help="where jobs run")
    p.add_argument("--token-file", help="file holding the bearer token (else $MESHRL_GATEWAY_TOKEN)")
    p.add_argument("--launcher", choices=list(LAUNCHERS),
                   default=os.environ.get("MESHRL_GATEWAY_LAUNCHER", "local"),
                   help="how jobs are started: local subprocesses, Ray, or the deployment's own service containers "
                        "(meshrl worker; compose and k8s) -- env MESHRL_GATEWAY_LAUNCHER")
    p.add_argument("--deployment-config", default=None,
                   help="with --launcher deployment: the deployment's wiring (where its services bind and meet), "
                        "merged into every job spec (else $MESHRL_DEPLOYMENT_CONFIG)")
    p.add_argument("--poll-interval", type=float, default=2.0, help="seconds between job status refreshes")
    p.add_argument("--max-running-jobs", type=int,
                   default=int(os.environ.get("MESHRL_GATEWAY_MAX_RUNNING_JOBS", "1") or 1),
                   help="jobs running (or paused) at once; later submits wait in a FIFO queue; 0 = no limit "
                        "(env MESHRL_GATEWAY_MAX_RUNNING_JOBS, default 1: a local job takes the whole machine)")
    p.add_argument("--access-log", default=None, help="access log file (default RUNS_DIR/gateway-access.log)")
    p.add_argument("--allow", action="append", default=[], metavar="WHAT[,WHAT]",
                   help="what submitted jobs may do beyond the defaults (repeatable, comma-separated): "
                        "trust_remote_code (run a checkpoint's own code), network (network for user code), "
                        "unsandboxed_tools (tools with sandbox: false), bind_any (listen on other addresses than "
                        "loopback), weak_sandbox (user code in the weaker process sandbox where bubblewrap cannot "
                        "run). Default: none of them (docs/security.md)")
    p.add_argument("--input-root", action="append", default=None, metavar="DIR",
                   help="a directory jobs may read inputs from (model, data, reward function, ...); repeatable; "
                        "default /models and /data (env MESHRL_GATEWAY_INPUT_ROOTS, ':'-separated)")


def check_port_free(flag: str, host: str, port: int) -> None:
    """Raise a one-line error when ``host:port`` cannot be bound (0 and negative: nothing to check)."""
    import errno
    import socket

    if port <= 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise ValueError(f"{flag} {port}: {host}:{port} {why} (choose another {flag})") from None


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pydantic import ValidationError

    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            print(f"meshrl gateway: cannot read --token-file: {exc}", file=sys.stderr)
            return 2
    else:
        token = os.environ.get("MESHRL_GATEWAY_TOKEN", "")
    if not token:
        print("meshrl gateway: no token: set MESHRL_GATEWAY_TOKEN or pass --token-file", file=sys.stderr)
        return 2
    from gateway_svc.server import Gateway, GatewaySettings

    if args.deployment_config:
        os.environ["MESHRL_DEPLOYMENT_CONFIG"] = args.deployment_config
    roots = args.input_root or [r for r in os.environ.get("MESHRL_GATEWAY_INPUT_ROOTS", "").split(os.pathsep) if r]
    from gateway_svc.policy import OperatorPolicy

    try:
        OperatorPolicy.make(args.allow)
    except ValueError as exc:
        print(f"meshrl gateway: {exc}", file=sys.stderr)
        return 2
    os.umask(0o077)  # the database, logs, run dirs and everything the jobs write: this user's only
    try:
        settings = GatewaySettings(
            token=token, host=args.host, port=args.port,
            grpc_port=None if args.grpc_port < 0 else args.grpc_port, db_url=args.db,
            runs_dir=Path(args.runs_dir), launcher=args.launcher, poll_interval=args.poll_interval,
            max_running_jobs=args.max_running_jobs or None,
            access_log=Path(args.access_log) if args.access_log else None,
            allow=list(args.allow), input_roots=[Path(r) for r in roots] if roots else None,
            token_file=Path(args.token_file) if args.token_file else None,
        )  # fmt: skip
    except ValidationError as exc:
        # Field and problem only: pydantic's own text would echo the input, and one input is the token.
        parts = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors(include_input=False)]
        print("meshrl gateway: " + "; ".join(parts), file=sys.stderr)
        return 2
    for flag, port in (("--port", args.port), ("--grpc-port", args.grpc_port)):
        check_port_free(flag, args.host, port)
    gw = Gateway(settings).start()
    print(f"meshrl gateway: REST {gw.http_url} (dashboard {gw.http_url}/dashboard), gRPC {gw.grpc_address}", flush=True)
    gw.serve_forever()
    return 0
