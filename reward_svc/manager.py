"""Score one group (a DataProto) the way verl's reward manager does, safely.

:meth:`RewardManager.score` takes a rollouts item and returns the experience item:

* ``token_level_scores`` (float32 ``[B, R]``): each sample's score on its last valid
  response token, zeros elsewhere (verl's ``NaiveRewardManager`` layout);
* ``reward_extra_info`` (dict per sample): the keys of a dict score (``{}`` for float
  scores and failures), except the keys listed in ``RewardConfig.extra_columns``, which get
  a non-tensor column each (verl's ``reward_extra_info`` layout; ``None`` where a sample
  lacks the key; stored as ``reward_<key>`` when the name is taken). The columns added
  never depend on the scorer's output, so all groups share one schema;
* ``error`` (str per sample, ``""`` when fine): the scorer's error, if any, appended to a
  rollout error already there, as ``"reward <kind>: <message>"``.

Inputs: tensors ``responses`` (int ``[B, R]``) and ``attention_mask`` (``[B, P+R]``) or
``response_mask`` (``[B, R]``); non-tensors ``data_source`` (the ``reward_fn_key``
column), ``reward_model`` (dict with ``ground_truth``) and optional ``extra_info``.
A batch missing required columns raises :class:`MalformedBatchError` and nothing else.

Built-in scorers run here, in-process (trusted, fast). A user function runs in the
:class:`~reward_svc.sandbox.pool.SandboxPool`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from reward_svc.decode import Decoder, final_turn_spans, response_lengths, valid_id_lists
from reward_svc.sandbox.pool import CallResult, SandboxPool, validate_result
from reward_svc.scorers import find_scorer
from services.config.reward import RewardConfig

_PROTECTED = {
    "responses", "prompts", "input_ids", "attention_mask", "error", "sample_id", "uid", "data_source",
    "reward_model", "extra_info", "reward_extra_info", "policy_version",
}


class MalformedBatchError(ValueError):
    """The batch lacks a column the reward manager needs (the message names it)."""


@dataclass
class ScoreReport:
    """Per-sample outcome of one :meth:`RewardManager.score` call, for metrics."""

    data_sources: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    error_kinds: list[str | None] = field(default_factory=list)


def _plain(value: Any) -> Any:
    """Ground truths / extra_info as JSON-able plain data (numpy arrays -> lists)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


class RewardManager:
    """Decode + score + write scores for whole groups (thread-safe if the pool is)."""

    def __init__(self, cfg: RewardConfig, decoder: Decoder, pool: SandboxPool | None = None, rm: Any = None) -> None:
        self.cfg = cfg
        self.decoder = decoder
        self.pool = pool
        self.rm = rm  # a RewardModelScorer when cfg.reward_model.enable
        self.kwargs = dict(cfg.custom_reward_function.reward_kwargs)
        if cfg.reward_model.enable and rm is None:
            raise ValueError("reward_model.enable needs a RewardModelScorer")
        if rm is None and pool is None and (cfg.custom_reward_function.path is not None or cfg.isolate_builtin):
            raise ValueError("a user reward function (or isolate_builtin) needs a SandboxPool")

    # -- inputs ----------------------------------------------------------------------------

    def _columns(self, data: Any) -> tuple[torch.Tensor, torch.Tensor, list[str], list[Any], list[Any]]:
        if data.batch is None or "responses" not in data.batch.keys():
            raise MalformedBatchError("batch has no 'responses' tensor")
        responses = data.batch["responses"]
        if responses.dim() != 2 or responses.dtype.is_floating_point or responses.dtype == torch.bool:
            raise MalformedBatchError(f"'responses' must be an integer [B, R] tensor, got {responses.dtype} {tuple(responses.shape)}")
        try:
            lengths = response_lengths(data.batch)
        except ValueError as exc:
            raise MalformedBatchError(str(exc)) from None
        nt = data.non_tensor_batch
        key = self.cfg.reward_fn_key
        if self.rm is not None:  # a reward model needs neither a task name nor a ground truth
            b = responses.shape[0]
            sources = [str(s) for s in nt[key].tolist()] if key in nt else ["reward_model"] * b
            return responses, lengths, sources, [None] * b, [None] * b
        if key not in nt:
            raise MalformedBatchError(f"non-tensor column {key!r} (reward_fn_key) is missing")
        if "reward_model" not in nt:
            raise MalformedBatchError("non-tensor column 'reward_model' (with 'ground_truth') is missing")
        sources = [str(s) for s in nt[key].tolist()]
        truths = []
        for rm in nt["reward_model"].tolist():
            truths.append(rm.get("ground_truth") if isinstance(rm, Mapping) else None)
        extra = nt["extra_info"].tolist() if "extra_info" in nt else [None] * len(sources)
        return responses, lengths, sources, truths, extra

    # -- scoring ---------------------------------------------------------------------------

    def _score_builtin(self, sources: list[str], texts: list[str], truths: list[Any]) -> list[CallResult]:
        out = []
        for src, text, truth in zip(sources, texts, truths, strict=True):
            scorer = find_scorer(src)
            if scorer is None:
                out.append(CallResult(0.0, error=f"no built-in reward function for data_source={src!r}", kind="exception"))
                continue
            if truth is None:
                out.append(CallResult(0.0, error="reward_model has no ground_truth", kind="invalid"))
                continue
            try:
                out.append(validate_result(scorer(text, truth, **self.kwargs), 0))
            except Exception as exc:  # noqa: BLE001 - a bad sample must not fail its group
                out.append(CallResult(0.0, error=f"{type(exc).__name__}: {exc}"[:2000], kind="exception"))
        return out

    def _score(self, sources: list[str], texts: list[str], truths: list[Any], extra: list[Any]) -> list[CallResult]:
        if self.pool is None:
            return self._score_builtin(sources, texts, truths)
        truths_p = [_plain(t) for t in truths]
        extra_p = [_plain(e) for e in extra]
        if self.cfg.reward_manager == "batch":
            args = {"data_sources": sources, "solution_strs": texts, "ground_truths": truths_p, "extra_infos": extra_p}
            return self.pool.score_batch(args, len(texts))
        items = [
            {"data_source": s, "solution_str": t, "ground_truth": g, "extra_info": e}
            for s, t, g, e in zip(sources, texts, truths_p, extra_p, strict=True)
        ]
        return self.pool.score(items)

    def score(self, data: Any) -> tuple[Any, ScoreReport]:
        """Score one group; return ``(experience_item, report)``. The item is modified in place."""
        out = self.score_many([data])[0]
        if isinstance(out, Exception):
            raise out
        return out

    def score_many(self, datas: list[Any]) -> list[tuple[Any, ScoreReport] | MalformedBatchError]:
        """Score several groups with one batched decode; a malformed group yields its error."""
        parsed: list[tuple[int, tuple]] = []
        out: list[Any] = [None] * len(datas)
        final_turn = self.rm is None and self.cfg.solution_str == "final_turn"
        spans: dict[int, list[tuple[int, int]]] = {}
        for i, data in enumerate(datas):
            try:
                cols = self._columns(data)
                if final_turn:
                    try:
                        start, end = final_turn_spans(data.batch, cols[1])
                        spans[i] = list(zip(start.tolist(), end.tolist(), strict=True))
                    except ValueError as exc:
                        raise MalformedBatchError(str(exc)) from None
                parsed.append((i, cols))
            except MalformedBatchError as exc:
                out[i] = exc
        all_ids: list[list[int]] = []
        for i, (responses, lengths, *_rest) in parsed:
            ids = valid_id_lists(responses, lengths)
            if final_turn:  # solution_str = the last model turn only (docs/reward.md)
                ids = [row[s:e] for row, (s, e) in zip(ids, spans[i], strict=True)]
            all_ids.extend(ids)
        texts = self.decoder.decode_batch(all_ids, skip_special_tokens=self.cfg.skip_special_tokens) if all_ids else []
        if self.rm is not None:
            results = self._score_rm([datas[i] for i, _ in parsed], texts)
        elif self.pool is None or self.cfg.reward_manager == "naive":  # one call for every sample
            sources = [s for _, c in parsed for s in c[2]]
            truths = [t for _, c in parsed for t in c[3]]
            extra = [e for _, c in parsed for e in c[4]]
            results = self._score(sources, texts, truths, extra)
        else:  # batch scorers see one group at a time
            results, start = [], 0
            for _, (responses, _l, src, tru, ext) in parsed:
                n = responses.shape[0]
                results.extend(self._score(src, texts[start : start + n], tru, ext))
                start += n
        start = 0
        for i, (responses, lengths, sources, _t, _e) in parsed:
            n = responses.shape[0]
            out[i] = self._finish(datas[i], responses, lengths, sources, results[start : start + n])
            start += n
        return out

    def _score_rm(self, datas: list[Any], texts: list[str]) -> list[CallResult]:
        """Reward-model scores of ``prompt + response`` texts (all groups at once)."""
        prompt_ids: list[list[int]] = []
        for data in datas:
            batch = data.batch
            r = batch["responses"].shape[-1]
            if "prompts" in batch.keys():
                prompts = batch["prompts"]
            elif "input_ids" in batch.keys():
                prompts = batch["input_ids"][:, :-r] if r else batch["input_ids"]
            else:
                prompts = batch["responses"][:, :0]
            p = prompts.shape[-1]
            mask = batch["attention_mask"][:, :p] if "attention_mask" in batch.keys() else torch.ones_like(prompts)
            arr, m = prompts.numpy(), (mask != 0).numpy()
            prompt_ids.extend(arr[i][m[i]].tolist() for i in range(arr.shape[0]))
        prompt_texts = self.decoder.decode_batch(prompt_ids, skip_special_tokens=self.cfg.skip_special_tokens)
        try:
            scores = self.rm.score([p + t for p, t in zip(prompt_texts, texts, strict=True)])
        except Exception as exc:  # noqa: BLE001 - a failed forward fails these samples, not the service
            return [CallResult(0.0, error=f"reward model: {type(exc).__name__}: {exc}"[:2000], kind="exception")] * len(texts)
        return [validate_result(s, 0) for s in scores]

    def _finish(
        self, data: Any, responses: torch.Tensor, lengths: torch.Tensor, sources: list[str], results: list[CallResult]
    ) -> tuple[Any, ScoreReport]:
        b, r = responses.shape
        scores = torch.tensor([res.score for res in results], dtype=torch.float32)
        tls = torch.zeros((b, r), dtype=torch.float32)
        if r > 0 and b > 0:
            pos = (lengths - 1).clamp(min=0)
            tls[torch.arange(b), pos] = scores
        data.batch["token_level_scores"] = tls
        self._write_extras(data, results)
        self._write_errors(data, results)
        return data, ScoreReport(sources, scores.tolist(), [res.kind for res in results])

    def _write_extras(self, data: Any, results: list[CallResult]) -> None:
        """Dict-score keys: declared ``extra_columns`` as columns, the rest in ``reward_extra_info``.

        The set of columns added never depends on what the scorer returned, so every
        scored group has the same schema (the trainer concatenates groups).
        """
        nt = data.non_tensor_batch
        declared = self.cfg.extra_columns
        for k in declared:
            name = f"reward_{k}" if k in _PROTECTED or k in nt else k
            col = np.empty(len(results), dtype=object)
            col[:] = [res.extra.get(k) for res in results]
            nt[name] = col
        info = np.empty(len(results), dtype=object)
        info[:] = [{k: v for k, v in res.extra.items() if k not in declared} for res in results]
        nt["reward_extra_info"] = info

    def _write_errors(self, data: Any, results: list[CallResult]) -> None:
        nt = data.non_tensor_batch
        prev = nt["error"].tolist() if "error" in nt else [""] * len(results)
        col = np.empty(len(results), dtype=object)
        for i, (p, res) in enumerate(zip(prev, results, strict=True)):
            p = "" if p is None else str(p)
            if res.error is None:
                col[i] = p
            else:
                msg = f"reward {res.kind}: {res.error}"
                col[i] = f"{p}; {msg}" if p else msg
        nt["error"] = col
