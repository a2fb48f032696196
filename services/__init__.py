"""meshrl's shared core: what several of its processes import.

Layers. Each running process is a top-level package of its own: ``trainer_svc``,
``rollout_svc``, ``reward_svc``, ``feeder_svc`` (the job's services), ``controller_svc``
(``meshrl run``'s job controller), ``gateway_svc`` (``meshrl gateway``) and ``worker_svc``
(``meshrl worker``, a deployment's service container) and ``fleet_svc`` (``meshrl fleet``,
warm replicas shared by adapter jobs). ``meshrl_cli`` is the ``meshrl``
command, which only dispatches to the processes' ``main``s and runs one-shot tools. The
arrows go one way: ``meshrl_cli`` -> process packages -> ``services``. ``services``
imports no process package and names none in a string it imports from; no process
package imports another or the CLI. Inside the core the order is
``(net, readiness, placement, registry, safe_arith, failures) -> (wire, protocol, config,
data, modelling, metrics, sandbox, auth, queues, weights) -> (procs, supervision, ledger,
handoff, entrypoint, fleets)``, with no cycle anywhere. What the core must know about the services
it learns without importing them (:mod:`services.registry`).
``tests/unit/test_layering.py`` checks these rules on every import, function-level ones
included.

Subpackages:
    protocol    DataProto, verl's batch type (tensors + numpy object columns + meta_info)
    wire        the safe, zero-copy frame codec DataProto travels as (never pickle)
    pb          Python stubs generated from ../proto/*.proto (never edited by hand)
    queues      the stream interface (Redis Streams / embedded gRPC broker)
    weights     the weight channel's shared half: bucket plans, control messages, the
                data-plane group, snapshots (the publisher is trainer_svc.weights, the
                receiver rollout_svc.weights)
    config      the job spec and each service's view of it (pydantic, no heavy imports)
    sandbox     untrusted code in isolated worker processes (reward functions, tools)
    metrics     Prometheus registries and the /health, /ready, /metrics server
    data        prompt datasets in verl's row schema, input checks, synthetic tasks
    modelling   the tiny test model built locally (tools and tests only)

Modules:
    registry    the names a job spec may use that the services define (estimators,
                losses, scorers, tool parsers), known without importing the services
    safe_arith  bounded exact arithmetic without ``eval`` (countdown scorer, calculator tool)
    auth        the job credential every internal gRPC call carries
    entrypoint  the one command line of every service process, parsed before heavy imports
    failures    how a failure is told to a user: one line and an exit code
    procs       child processes of a job: start, wait until ready, watch, stop
    supervision the restart policy every launcher applies
    ledger      the samples' lifecycle counts (lost, trained twice) a job ends with
    handoff     the files a deployment's gateway and its service containers meet through
    fleets      the files a fleet of warm replicas and the jobs attached to it meet through
    readiness   the ``MESHRL_READY`` line a service prints when it can work, and its parser
    placement   CPU pinning of a service process (``services.<service>.cpus``)
    net         small networking helpers (free ports, waiting for a port, TCPStore, local addresses)
"""

__version__ = "0.1.0"
