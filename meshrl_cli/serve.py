"""``meshrl serve RUN_DIR``: serve a running job's live policy through Ray Serve, OpenAI-style.

Deploys ``rollout_svc.ray_serve`` (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``) on the Ray cluster at ``--address``, built from the job's run
directory (its rollout view and credential); returns once the application answers and
prints its base URL. The application stays on the cluster (Serve owns it) until
``meshrl serve RUN_DIR --delete`` or ``serve shutdown``. Same as
``serve run rollout_svc.ray_serve:build run_dir=RUN_DIR`` (which blocks instead).
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="the job's run directory (config/rollout-0.yaml and job.credential are read there)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS, else auto)")
    p.add_argument("--host", default="127.0.0.1", help="where Serve's HTTP proxy listens, if Serve is not running yet")
    p.add_argument("--port", type=int, default=8000, help="its port (default 8000)")
    p.add_argument("--name", default="meshrl-policy", help="Serve application name (default meshrl-policy)")
    p.add_argument("--route-prefix", default="/", help="HTTP route prefix of the application (default /)")
    p.add_argument("--model-name", default=None, help="the model id clients name (default: the run directory's name)")
    p.add_argument("--replicas", type=int, default=None, help="a fixed number of replicas (default 1)")
    p.add_argument("--min-replicas", type=int, default=None, help="Serve autoscaling: fewest replicas")
    p.add_argument("--max-replicas", type=int, default=None, help="Serve autoscaling: most replicas")
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs each replica reserves (default 1)")
    p.add_argument("--proxy-location", choices=["HeadOnly", "EveryNode", "Disabled"], default=None,
                   help="where Serve runs HTTP proxies (Serve's default when omitted)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the replicas to load (default 900)")
    p.add_argument("--api-key-file", default=None,
                   help="a file holding the key clients must send (the openai client's api_key); default: no check")
    p.add_argument("--delete", action="store_true", help="remove the application instead")


def run(args: argparse.Namespace) -> int:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"meshrl serve needs Ray Serve: pip install 'meshrl[ray]' ({exc})") from None
    from rollout_svc import ray_serve

    if args.delete:
        import os

        ray.init(address=args.address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False)
        ray_serve.undeploy(args.name)
        print(f"deleted Serve application {args.name}")
        return 0
    build_args = {"run_dir": args.run_dir, "num_cpus": args.num_cpus}
    if args.api_key_file:
        build_args["api_key_file"] = args.api_key_file
    if args.model_name:
        build_args["model_name"] = args.model_name
    if args.min_replicas is not None or args.max_replicas is not None:
        if args.replicas is not None:
            raise ValueError("give --replicas or --min-replicas/--max-replicas (autoscaling), not both")
        build_args.update({k: v for k, v in (("min_replicas", args.min_replicas), ("max_replicas", args.max_replicas))
                           if v is not None})
    elif args.replicas is not None:
        build_args["num_replicas"] = args.replicas
    url = ray_serve.deploy(build_args, address=args.address, host=args.host, port=args.port, app_name=args.name,
                           route_prefix=args.route_prefix, proxy_location=args.proxy_location, timeout_s=args.timeout)
    print(f"serving the live policy of {args.run_dir} at {url}/v1 (OpenAI API; policy_version in every answer)")
    return 0
