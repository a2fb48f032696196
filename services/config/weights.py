"""Weight channel configuration: how the trainer's publisher reaches the rollout replicas.

One ``WeightChannelConfig`` is shared by both ends: the publisher (trainer rank 0) binds
``host:control_port`` (gRPC ``WeightService``) and hosts the rendezvous TCPStore on
``host:rendezvous_port``; a replica needs only ``host:control_port`` -- the rendezvous
address, backend and deadline of each data group are announced on the control channel.
Imports only pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.config.base import StrictModel


class WeightChannelConfig(StrictModel):
    """Settings of the weight channel (publisher and receivers read the same block)."""

    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="Collective backend of the data plane. 'auto' = nccl when the publisher has "
        "a CUDA device and torch has NCCL, else gloo. Chosen by the publisher and announced to "
        "the replicas, which must be able to run it.",
    )
    bucket_mb: float = Field(
        64.0,
        gt=0,
        le=16384,
        description="Bucket size in MiB: tensors are packed in order into flat byte buffers of "
        "at most this size, one broadcast per bucket. A larger tensor is split into pieces over "
        "consecutive buckets, so this bounds every buffer of the channel whatever the model.",
    )
    wire_dtype: Literal["auto", "off", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Publisher side: the dtype floating-point tensors travel in. Tensors with "
        "wider elements are cast while they are packed (no extra copy); narrower ones and "
        "non-float tensors travel as they are. 'auto' = the dtype the replicas of a transfer "
        "serve, when they all announced the same one (fp32 master weights go as bf16 to bf16 "
        "replicas: half the bytes); 'off' = never cast. The snapshot holds what was sent.",
    )
    zero_copy_min_mb: float = Field(
        4.0,
        gt=0,
        le=16384,
        description="With publish(..., borrow=True) (or snapshot off), a contiguous tensor of at "
        "least this many MiB on the channel's device is broadcast straight from its own memory as "
        "a bucket of its own instead of being copied into a packed bucket.",
    )
    pipeline_depth: int = Field(
        3,
        ge=1,
        le=16,
        description="Broadcasts in flight at once on each side: bucket k+1 is already posted while "
        "bucket k is on the wire, so no thread wake-up sits on the critical path (1 = strictly one "
        "after another).",
    )
    transfer_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Deadline of every data-plane step: forming a group, each bucket's "
        "broadcast, and the receivers' acknowledgements. A dead or hung replica costs the "
        "publisher at most this long per publish; it is then dropped from the group.",
    )
    host: str = Field(
        "127.0.0.1",
        min_length=1,
        max_length=255,
        description="Address of the publisher as replicas reach it; the publisher binds its "
        "gRPC server and rendezvous store here ('0.0.0.0' binds everywhere but is then "
        "advertised as advertise_host).",
    )
    advertise_host: str | None = Field(
        None,
        max_length=255,
        description="Address announced to replicas for the rendezvous store; None = host.",
    )
    control_port: int = Field(
        50070,
        ge=0,
        le=65535,
        description="gRPC WeightService port of the publisher (0 = any free port; the publisher "
        "reports the bound one as WeightPublisher.control_address).",
    )
    rendezvous_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="TCPStore port of the data-group rendezvous (0 = any free port; it is "
        "announced to replicas in each JOIN message).",
    )
    gloo_interface: str | None = Field(
        None,
        max_length=64,
        description="Network interface gloo binds to (e.g. 'eth0', 'lo'); None = the "
        "machine's hostname (gloo's default device).",
    )
    gloo_threads: int = Field(2, ge=1, le=64, description="Worker threads of each gloo group.")
    gloo_devices: int = Field(
        2,
        ge=1,
        le=8,
        description="Publisher side, gloo only: connection sets (each with its own I/O thread) of "
        "every data group; consecutive broadcasts alternate between them, so pipelined buckets "
        "travel in parallel. Sent to the replicas in JOIN (all ranks must agree).",
    )
    snapshot: bool = Field(
        True,
        description="Keep the latest published version in reusable CPU buffers (one model copy "
        "of host memory; on CPU they are also the broadcast source, so this costs no extra copy) "
        "and serve it as safetensors (FetchSnapshot) to replicas that join late or missed a "
        "transfer. Off: the publisher packs into two rotating buffers and serves no snapshot.",
    )
    snapshot_dir: str | None = Field(
        None,
        description="Directory where the publisher persists the latest snapshot as "
        "weights-v<version>.safetensors when it closes (and on save_snapshot()); None = keep it "
        "in memory only.",
    )
    snapshot_chunk_kb: int = Field(
        1024,
        ge=16,
        le=3584,
        description="Size of one FetchSnapshot stream message in KiB (below gRPC's 4 MiB "
        "default message limit).",
    )
    receive_ahead_buckets: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="How many received buckets a replica buffers ahead of its consumer; "
        "0 = a whole version (the replica is never the reason a transfer is slow, at the cost "
        "of one model copy of memory). With a bound, a consumer that stops reading for "
        "longer than transfer_timeout_s makes the replica miss the transfer.",
    )
    reuse_buffers: bool = Field(
        False,
        description="Replica side: recycle the memory of bucket k once the consumer asks for bucket "
        "k+1 (no page faults on fresh memory per version). Only for consumers that copy each "
        "tensor before moving on, as vLLM's load_weights does; off = every bucket is fresh memory "
        "the consumer may keep.",
    )
    max_replicas: int = Field(
        256, ge=1, le=65536, description="Most replicas that may subscribe at once."
    )
    connect_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="How long a replica waits for the publisher's control channel in connect() "
        "and how long it keeps retrying after the control stream breaks.",
    )

    @model_validator(mode="after")
    def _check(self) -> "WeightChannelConfig":
        if self.host == "0.0.0.0" and not self.advertise_host:
            raise ValueError("weights.host is 0.0.0.0: set weights.advertise_host to an address replicas can reach")
        return self

    @property
    def bucket_bytes(self) -> int:
        """bucket_mb in bytes (at least 1)."""
        return max(1, int(self.bucket_mb * (1 << 20)))

    @property
    def rendezvous_host(self) -> str:
        """The address announced for the rendezvous store."""
        return self.advertise_host or self.host
