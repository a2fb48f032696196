"""meshrl's shared core: every service imports from here.

Layers. The service packages (``trainer_svc``, ``rollout_svc``, ``reward_svc``,
``feeder_svc``: one folder per running process) import from ``services``; ``services``
imports no service package, and no service package imports another, so each process
loads only its own code and what they share lives here. The one exception is
:mod:`services.cli`, the application's top: ``meshrl`` starts the services, and may import
them (lazily, inside the subcommand that needs them). What the core must know about the
services it learns without importing them (:mod:`services.registry`). No two modules
import each other, directly or around a loop. ``tests/unit/test_layering.py`` checks all
three rules on every import, function-level ones included.

Subpackages:
    protocol    DataProto, verl's batch type (tensors + numpy object columns + meta_info)
    wire        the safe, zero-copy frame codec DataProto travels as (never pickle)
    pb          Python stubs generated from ../proto/*.proto (never edited by hand)
    queues      the stream interface (Redis Streams / embedded gRPC broker)
    weights     the weight channel (trainer -> rollout replicas)
    config      the job spec and each service's view of it (pydantic, no heavy imports)
    sandbox     untrusted code in isolated worker processes (reward functions, tools)
    metrics     Prometheus registries and the /health, /ready, /metrics server
    tracking    experiment loggers (console, jsonl, tensorboard, wandb, mlflow)
    data        prompt datasets in verl's row schema, input checks, synthetic tasks
    modelling   the tiny test model built locally (tools and tests only)
    launch      ``meshrl run``: one job on this machine (controller, supervision, ledger)
    gateway     ``meshrl gateway``: many jobs (REST and gRPC APIs, job store, dashboard)
    cli         the ``meshrl`` command

Modules:
    registry    the names a job spec may use that the services define (estimators,
                losses, scorers, tool parsers), known without importing the services
    safe_arith  bounded exact arithmetic without ``eval`` (countdown scorer, calculator tool)
    auth        the job credential every internal gRPC call carries
    entrypoint  the one command line of every service process, parsed before heavy imports
    readiness   the ``MESHRL_READY`` line a service prints when it can work, and its parser
    placement   CPU pinning of a service process (``services.<service>.cpus``)
    net         small networking helpers (free ports, waiting for a port, TCPStore, local addresses)
    warmstart   the short supervised warm start before RL (``meshrl warm-start``)
"""

__version__ = "0.1.0"
