"""OpenAI-style requests on a rollout replica's engine: ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` for the live policy of a job.

:class:`PolicyServer` is a rollout replica without the stream loop: the same
:class:`~rollout_svc.engine.RolloutEngine` (vLLM ``AsyncLLM``) and
:class:`~rollout_svc.replica.Replica`, started from a job's rollout view, following the job's
weight channel with the replicas' own subscriber (:mod:`rollout_svc.subscriber`: it joins
the publisher like one more replica, catches up from the snapshot, then loads every new
version in place). It generates nothing on its own; each request is one or more vLLM
requests batched with whatever else is running.

Every answer says which policy version produced it: ``policy_version`` in the body (the
oldest version any of its choices was generated with: a version that arrives mid-request
lets the request finish on the new weights, as in training) and ``system_fingerprint``
``meshrl-policy-v<N>``; ``/v1/models`` lists the model with the version served now. With the
canary gate (``weights.rollout.mode: canary``) that is always a promoted version: the server
subscribes as promoted-only, so it is never a canary and never loads a candidate.

The HTTP side (routing, Ray Serve) is :mod:`rollout_svc.ray_serve`; this module raises
:class:`OpenAIError` (status, message, parameter) for bad input, which it turns into an
OpenAI-shaped error body.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.config.rollout import SamplingConfig
from services.config.views import RolloutView

log = logging.getLogger(__name__)

MAX_CHOICES = 16
ABORT_RETRIES = 3


class OpenAIError(Exception):
    """A request the endpoint refuses: ``status`` (HTTP), ``message``, the offending ``param``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


class _Request(BaseModel):
    """What both endpoints take (unknown fields are refused, naming them)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    user: str | None = None


class CompletionRequest(_Request):
    prompt: str | list[int]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


def parse(cls: type[_Request], body: Any) -> _Request:
    """``body`` (decoded JSON) as ``cls``, or OpenAIError 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object")
    try:
        req = cls.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or None
        msg = "is not supported by this endpoint" if err["type"] == "extra_forbidden" else err["msg"]
        raise OpenAIError(400, f"{where}: {msg}" if where else msg, where) from None
    if req.stream:
        raise OpenAIError(400, "stream=true is not supported: this endpoint answers whole responses", "stream")
    return req


class PolicyServer:
    """A job's live policy behind OpenAI-style calls (see the module docstring).

    Args:
        view: the job's rollout view (``<run_dir>/config/rollout-0.yaml``): model, sampling
            limits, engine settings and the weight channel to follow (None: fixed weights).
        model_name: the model id clients name (``/v1/models``).
        name: this server's name on the weight channel (unique among its subscribers).
    """

    def __init__(self, view: RolloutView, *, model_name: str, name: str) -> None:
        from rollout_svc.engine import RolloutEngine
        from rollout_svc.replica import Replica

        self.view = view
        self.model_name = model_name
        self.name = name
        cfg = view.rollout
        self.engine = RolloutEngine(cfg, view.model.path, dtype=view.model.dtype, tokenizer=view.model.tokenizer_path,
                                    trust_remote_code=view.model.trust_remote_code)
        self.replica = Replica(self.engine, cfg, name=name)  # no queues: it serves requests only
        self.replica.promoted_only = True  # users never see a canary's candidate (weights.rollout.mode=canary)
        self.tokenizer = None
        self.created = int(time.time())
        self._stop = asyncio.Event()
        self._weights: asyncio.Task | None = None
        self.requests = 0

    async def start(self) -> None:
        """Load vLLM (within ``rollout.engine_startup_timeout_s``) and start following the channel."""
        await self.engine.start()
        self.tokenizer = self.engine.llm.get_tokenizer()
        if self.view.weights is not None:
            from rollout_svc.subscriber import run_weight_subscriber

            self._weights = asyncio.create_task(run_weight_subscriber(self.replica, self.view.weights, self.name,
                                                                      self._stop), name="weights")

    @property
    def version(self) -> int:
        return self.engine.version

    def healthy(self) -> str:
        """Why this server cannot answer ("" when it can)."""
        if not self.engine.healthy:
            return "the vLLM engine is not running"
        if self.engine.weights_dirty:
            return "a weight update failed half way; waiting for a complete version"
        if self._weights is not None and self._weights.done():
            exc = self._weights.exception() if not self._weights.cancelled() else None
            return f"the weight subscriber stopped: {exc!r}"
        return ""

    async def close(self) -> None:
        self._stop.set()
        if self._weights is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._weights), timeout=10.0)
            except Exception:  # noqa: BLE001 - stopping anyway
                self._weights.cancel()
        self.engine.shutdown()

    # -- the three endpoints -------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_card()]}

    def _model_card(self) -> dict[str, Any]:
        # canary mode: policy_version is the promoted version ("promoted"); mode all: the newest ("latest")
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "meshrl",
                "policy_version": self.version, "policy": "latest" if self.replica.weights_canary is None
                else "promoted", "max_model_len": self.engine.cfg.prompt_length
                + self.engine.cfg.response_length}  # fmt: skip

    async def completions(self, body: Any) -> dict[str, Any]:
        req = parse(CompletionRequest, body)
        self._check_model(req.model)
        if isinstance(req.prompt, str):
            ids = self.tokenizer.encode(req.prompt)  # special tokens as the tokenizer adds them (as vLLM's server)
        else:
            ids = list(req.prompt)
        choices, version, usage = await self._generate(ids, req, req.max_tokens)
        return self._answer("text_completion", "cmpl", req, version, usage,
                            [{"index": i, "text": text, "finish_reason": reason, "logprobs": None}
                             for i, (text, reason) in enumerate(choices)])  # fmt: skip

    async def chat(self, body: Any) -> dict[str, Any]:
        req = parse(ChatRequest, body)
        self._check_model(req.model)
        if req.max_tokens is not None and req.max_completion_tokens is not None:
            raise OpenAIError(400, "give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # noqa: BLE001 - a template that refuses these messages (or there is none)
            raise OpenAIError(400, f"messages: the model's chat template cannot render them: {exc}", "messages") from None
        if not isinstance(ids, list):  # a BatchEncoding (newer transformers return a dict by default)
            ids = ids["input_ids"]
        choices, version, usage = await self._generate(list(ids), req, req.max_completion_tokens or req.max_tokens)
        return self._answer("chat.completion", "chatcmpl", req, version, usage,
                            [{"index": i, "message": {"role": "assistant", "content": text},
                              "finish_reason": reason, "logprobs": None}
                             for i, (text, reason) in enumerate(choices)])  # fmt: skip

    # -- internals -------------------------------------------------------------------------------

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise OpenAIError(404, f"The model `{model}` does not exist; this endpoint serves `{self.model_name}`",
                              "model", kind="not_found_error")  # fmt: skip

    async def _generate(self, ids: list[int], req: _Request, max_tokens: int | None):
        cfg = self.engine.cfg
        if max_tokens is not None and max_tokens > cfg.response_length:
            raise OpenAIError(400, f"max_tokens={max_tokens} exceeds this policy's response length "
                                   f"{cfg.response_length} (the job's data.max_response_length)", "max_tokens")
        bad = self.engine.check_prompt(ids)
        if bad:
            raise OpenAIError(400, f"prompt: {bad}", "prompt")
        unhealthy = self.healthy()
        if unhealthy:
            raise OpenAIError(503, unhealthy, kind="service_unavailable")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        sampling = SamplingConfig(n=1, temperature=req.temperature, top_p=req.top_p, do_sample=req.temperature > 0)
        rid = uuid.uuid4().hex
        seed_base = f"openai-{req.seed}" if req.seed is not None else rid
        self.requests += 1

        async def one(k: int):
            # with rollout.on_weight_update=abort_requeue a new version aborts what is generating:
            # generate it again on the new weights (as the replicas regenerate a group)
            for attempt in range(ABORT_RETRIES + 1):
                s = await self.engine.generate_one(ids, sampling, f"{self.name}-{rid}/{k}.{attempt}",
                                                   max_tokens=max_tokens, seed_key=f"{seed_base}/{k}", stop=stop)
                if s.finish_reason != "abort":
                    return s
            raise OpenAIError(503, f"the request was aborted by {ABORT_RETRIES + 1} weight updates in a row; retry",
                              kind="service_unavailable")

        samples = await asyncio.gather(*(one(k) for k in range(req.n)))
        failed = next((s for s in samples if s.error), None)
        if failed is not None:
            from rollout_svc.engine import EngineDeadError

            if not self.engine.healthy:
                raise EngineDeadError(failed.error)
            raise OpenAIError(400, failed.error)
        choices = []
        for s in samples:
            toks = [t for t in s.response_ids if t not in self.engine.eos_token_ids]
            text = self.tokenizer.decode(toks, skip_special_tokens=True)
            cuts = [text.find(st) for st in stop if st and st in text]
            if cuts:  # vLLM stopped at a stop string; OpenAI's answer leaves it out
                text = text[: min(cuts)]
            choices.append((text, "length" if s.finish_reason == "length" else "stop"))
        usage = {"prompt_tokens": len(ids), "completion_tokens": sum(len(s.response_ids) for s in samples)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return choices, min(s.policy_version for s in samples), usage

    def _answer(self, obj: str, prefix: str, req: _Request, version: int, usage: dict, choices: list) -> dict:
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
                "model": self.model_name, "system_fingerprint": f"meshrl-policy-v{version}",
                "policy_version": version, "choices": choices, "usage": usage}  # fmt: skip
