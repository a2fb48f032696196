"""RewardConfig: how the reward service scores samples (verl's ``reward_model`` /
``custom_reward_function`` keys, plus meshrl's isolation and service settings).

A user reward function is configured as in verl::

    reward:
      custom_reward_function:
        path: my_rewards.py        # a .py file, or a dotted module name
        name: compute_score        # function in it
        reward_kwargs: {threshold: 0.5}
      reward_manager: naive        # naive = one call per sample; batch = one call per group

Without ``custom_reward_function.path`` the built-in scorers
(``reward_svc.scorers.default_compute_score``) run in-process. User functions always run
in a pool of sandboxed worker processes (timeout, memory limit, no network by default).
Imports only pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from services.config.base import StrictModel


class CustomRewardFunction(StrictModel):
    """A user reward function, located as verl locates one."""

    path: str | None = Field(
        None,
        max_length=4096,
        description="Python file (ends in .py) or importable dotted module holding the function; "
        "None uses the built-in scorers, dispatched by data_source.",
    )
    name: str = Field(
        "compute_score",
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the function in `path`. Per-sample signature: "
        "f(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs) -> float | dict; "
        "batch signature: f(data_sources, solution_strs, ground_truths, extra_infos, **reward_kwargs) -> list.",
    )
    reward_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments passed to every call (plain JSON values only).",
    )


class RewardModelConfig(StrictModel):
    """A reward model (verl's ``reward_model.enable``): replaces the rule/function scorers."""

    enable: bool = Field(False, description="Score with a sequence-classification checkpoint instead of functions.")
    path: str | None = Field(
        None, max_length=4096, description="Local HuggingFace directory of the reward model (safetensors, its tokenizer)."
    )
    micro_batch_size: int = Field(16, ge=1, le=4096, description="Samples per forward pass.")
    max_length: int = Field(2048, ge=8, le=1_048_576, description="Prompt+response tokens kept (truncated on the right).")

    @model_validator(mode="after")
    def _path_when_enabled(self) -> "RewardModelConfig":
        if self.enable and not self.path:
            raise ValueError("reward_model.enable needs reward_model.path")
        return self


class RewardConfig(StrictModel):
    """The reward service block of the job spec."""

    custom_reward_function: CustomRewardFunction = Field(
        default_factory=CustomRewardFunction, description="User reward function (verl style); default built-ins."
    )
    reward_model: RewardModelConfig = Field(
        default_factory=RewardModelConfig, description="Optional reward model (replaces the scorer functions)."
    )
    reward_manager: Literal["naive", "batch"] = Field(
        "naive",
        description="naive: the scorer is called once per sample; batch: once per group with lists "
        "(verl's BatchRewardManager signature).",
    )
    reward_fn_key: str = Field(
        "data_source", min_length=1, max_length=256, description="Non-tensor column that names each sample's task."
    )
    tokenizer_path: str | None = Field(
        None,
        max_length=4096,
        description="Tokenizer directory (with tokenizer.json) or tokenizer.json file used to decode responses; "
        "None uses the job's model tokenizer.",
    )
    solution_str: Literal["response", "final_turn"] = Field(
        "response",
        description="The text scorers receive as solution_str. response: every response token, as verl "
        "(in a multi-turn trajectory that includes the tool observations); final_turn: only the last model "
        "turn, the tokens after the last observation (the whole response for single-turn samples). "
        "A reward model always scores prompt + whole response.",
    )
    skip_special_tokens: bool = Field(True, description="Drop special tokens (EOS, pad) when decoding, as verl does.")
    isolate_builtin: bool = Field(
        False, description="Run the built-in scorers in the sandbox pool too (slower; they are trusted code)."
    )
    num_workers: int = Field(2, ge=1, le=256, description="Sandboxed worker processes that run user functions.")
    call_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Deadline of one per-sample call; past it the worker is killed, score 0."
    )
    batch_timeout_s: float = Field(
        120.0, gt=0, le=86_400, description="Deadline of one batch-scorer call (a whole group)."
    )
    memory_limit_mb: int = Field(
        2048, ge=128, le=1_048_576, description="Address-space limit (RLIMIT_AS) of each worker process, MiB."
    )
    allow_network: bool = Field(
        False, description="Let user functions use the network; false puts each worker in an empty network namespace."
    )
    max_result_bytes: int = Field(
        65_536, ge=256, le=16 << 20, description="Largest JSON result one call may return; larger is an error."
    )
    extra_columns: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Keys of dict scores written as their own per-sample non-tensor columns (verl's "
        "reward_extra_info layout), present in EVERY scored group (None where a sample lacks the key) so "
        "groups always concatenate; all other keys go into the per-sample dict column `reward_extra_info`.",
    )
    max_extra_columns: int = Field(
        32, ge=0, le=1024, description="Most extra columns a dict score may add (keys beyond are an error)."
    )
    worker_start_timeout_s: float = Field(
        30.0, gt=0, le=600, description="Deadline for a new worker process to report that it is ready."
    )
    input_stream: str = Field("rollouts", min_length=1, max_length=256, description="Stream of generated groups.")
    output_stream: str = Field("experience", min_length=1, max_length=256, description="Stream of scored groups.")
    consumer_group: str = Field("reward", min_length=1, max_length=256, description="Consumer group on input_stream.")
    output_group: str = Field(
        "trainer", min_length=1, max_length=256, description="Consumer group that reads output_stream (the trainer's)."
    )
    validation_stream: str = Field(
        "validation", min_length=1, max_length=256,
        description="Stream of scored validation groups (meta_info validate=true); read by the job controller.",
    )
    validation_group: str = Field(
        "controller", min_length=1, max_length=256, description="Consumer group that reads validation_stream.",
    )
    get_batch: int = Field(8, ge=1, le=4096, description="Groups leased per get().")
    get_timeout_s: float = Field(1.0, gt=0, le=600, description="How long one get() waits for input.")
    grpc_max_message_bytes: int = Field(
        256 << 20, ge=1 << 20, le=2_000_000_000, description="Largest gRPC Score request/response message."
    )

    @model_validator(mode="after")
    def _batch_needs_function(self) -> "RewardConfig":
        if self.reward_manager == "batch" and self.custom_reward_function.path is None:
            raise ValueError("reward_manager='batch' needs custom_reward_function.path (built-ins are per-sample)")
        return self
