"""meshrl's shared core: every service imports from here.

Subpackages:
    protocol  DataProto, verl's batch type (tensors + numpy object columns + meta_info)
    wire      the safe, zero-copy frame codec DataProto travels as (never pickle)
    pb        Python stubs generated from ../proto/*.proto (never edited by hand)
    queues    the stream interface (Redis Streams / embedded gRPC broker)
    weights   the weight channel (trainer -> rollout replicas)
    config    the job spec (pydantic, no heavy imports)
    metrics   Prometheus registries and the /health, /ready, /metrics server
    cli       the `meshrl` command
"""

__version__ = "0.1.0"
