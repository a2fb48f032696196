"""``python -m rollout_svc --config rollout.yaml [--id NAME] [a.b=c ...]``: run one rollout replica.

The file is the rollout view of a job (:class:`services.config.views.RolloutView`; written by
``meshrl run`` or ``meshrl views``). Arguments and the view are checked before torch/vLLM
are imported (``--help`` is instant). Once the engine is loaded the process announces
readiness with the one ``MESHRL_READY {...}`` line (``services.readiness``: addresses
``grpc`` and ``metrics``, ``device``, ``dtype``), then serves until SIGTERM/SIGINT: it
stops leasing, finishes and delivers the groups in flight, and exits 0.

With ``--fleet-dir DIR`` it is a replica of a fleet instead (``rollout_svc/fleet_member.py``):
the view is the fleet's, and the jobs come and go through the fleet's directory.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from services.config.views import RolloutView
    from services.entrypoint import load_view_or_exit, parse_with_overrides, pin_or_exit, service_parser

    p = service_parser("rollout", "Run one meshrl rollout replica (vLLM).", default_id="rollout-0")
    p.add_argument("--fleet-dir", default=None, help="run as a replica of the fleet in this directory: serve every "
                   "attached job's adapter (started by `meshrl fleet start`; docs/fleet.md)")
    p.add_argument("--adapter-slots", type=int, default=4, help="with --fleet-dir: jobs served at once (default 4)")
    args = parse_with_overrides(p, argv)
    view = load_view_or_exit(RolloutView, args, "rollout_svc")
    pin_or_exit(view.resources.cpus, "services.rollout.cpus", "rollout_svc", vllm=True)
    import asyncio
    import logging

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.fleet_dir:
        from rollout_svc.fleet_member import serve_fleet

        return asyncio.run(serve_fleet(view, name=args.id, fleet_dir=args.fleet_dir, slots=args.adapter_slots))
    from rollout_svc.replica_process import serve

    return asyncio.run(serve(view, name=args.id))


if __name__ == "__main__":
    sys.exit(main())
