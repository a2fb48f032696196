"""The policy on FSDP2: ``compute_log_prob`` and ``update_policy`` with verl's semantics.

Batch conventions (``B`` samples on this rank, ``L`` = prompt + response length, ``R`` the
padded response length; the prompt is left-padded, the response right-padded):

- ``input_ids`` int64 ``[B, L]``, ``attention_mask`` int64 ``[B, L]``, ``position_ids``
  int64 ``[B, L]``, ``responses`` int64 ``[B, R]`` (the last ``R`` columns of ``input_ids``);
- ``response_mask`` ``[B, R]`` 1 on tokens that get a loss;
- ``old_log_probs``, ``advantages``, optional ``ref_log_prob`` / ``rollout_log_probs``:
  float32 ``[B, R]``.

Loss normalisation is global: the valid-token (or valid-sequence) count of a whole
mini-batch across all data-parallel ranks is all-reduced first, and every micro-batch
loss is divided by it and multiplied by the world size (FSDP averages gradients). So the
update is the same whether the mini-batch runs on one rank or many, in one micro-batch
or several -- the property ``tests/integration/test_trainer_fsdp.py`` checks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from services.config.trainer import ActorConfig, OffPolicyConfig
from services.protocol import DataProto
from trainer_svc import core_algos
from trainer_svc.fsdp import clip_grad_norm
from trainer_svc.seqlen import num_micro_batches, pack_micro_batches

logger = logging.getLogger(__name__)

_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


class NonFiniteLossError(RuntimeError):
    """Raised (only by callers that ask for it) when a step produced NaN/inf."""


@dataclass
class UpdateResult:
    """What one ``update_policy`` call did.

    ``metrics`` are means over mini-batches (and ranks); ``optimizer_steps`` counts the
    mini-batches whose update was applied, ``skipped_steps`` those skipped because the
    loss or the gradient norm was NaN/inf (their gradients are discarded, weights untouched).
    """

    metrics: dict[str, float] = field(default_factory=dict)
    optimizer_steps: int = 0
    skipped_steps: int = 0


def forward_log_probs(
    module: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float,
    calculate_entropy: bool,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Run the causal LM over ``input_ids`` and score ``responses``.

    Only the last ``R + 1`` positions go through the LM head (``logits_to_keep``), so the
    prompt costs no vocabulary projection. Returns ``(entropy [B, R] or None, log_probs
    [B, R])`` in float32, computed from ``logits / temperature``, 0 at response positions
    without a token (``attention_mask`` 0, as verl's unpadded path returns them), so the
    result does not depend on how rows are grouped into micro-batches. With
    ``entropy_grad=False`` the entropy is a detached metric (no backward through the extra
    softmax).
    """
    full_r = batch["responses"].shape[1]
    lo, hi = _valid_columns(batch["attention_mask"])
    r = max(0, hi - (batch["input_ids"].shape[1] - full_r))  # response columns that hold a token
    responses = batch["responses"][:, :r]
    out = module(
        input_ids=batch["input_ids"][:, lo:hi],
        attention_mask=batch["attention_mask"][:, lo:hi],
        position_ids=batch["position_ids"][:, lo:hi],
        use_cache=False,
        logits_to_keep=r + 1,
    )
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    log_probs = torch.gather(logits, -1, responses.unsqueeze(-1)).squeeze(-1) - logz
    no_token = batch["attention_mask"][:, -full_r:][:, :r] == 0
    entropy = None
    if calculate_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = logz - (torch.softmax(logits, dim=-1) * logits).sum(-1)
            entropy = torch.nn.functional.pad(entropy.masked_fill(no_token, 0.0), (0, full_r - r))
    return entropy, torch.nn.functional.pad(log_probs.masked_fill(no_token, 0.0), (0, full_r - r))


def _valid_columns(attention_mask: torch.Tensor) -> tuple[int, int]:
    """``[lo, hi)``: the columns of a micro-batch that hold a token in some row.

    Prompts are left-padded to the rollout's ``prompt_length`` and responses right-padded to
    ``response_length``, so a batch of short prompts and answers is mostly padding (the
    quick start's is a third: 26 of 38 columns at the first step, 22 later). Padding columns
    change no result -- left of every prompt they are masked keys, right of every response
    they come after every scored position in a causal model -- but cost a full forward and
    backward, so they are cut; scores of cut response columns are 0 (``response_mask`` is 0
    there).
    """
    cols = attention_mask.any(0).nonzero()
    if cols.numel() == 0:
        return 0, attention_mask.shape[1]
    return int(cols[0]), int(cols[-1]) + 1


def all_reduce(t: torch.Tensor, group: dist.ProcessGroup | None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce over ``group`` (no-op without a group or with one rank)."""
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def micro_batch_indices(
    data: DataProto, group: dist.ProcessGroup | None, fixed_size: int, dynamic: bool, max_tokens: int
) -> list[list[int]]:
    """Row indices of each micro-batch of ``data``.

    Fixed: consecutive runs of ``fixed_size`` rows. Dynamic (verl's ``use_dynamic_bsz``):
    packed by ``attention_mask`` token count under ``max_tokens``, with the same number
    of micro-batches on every rank of ``group`` (FSDP2 needs the same collectives
    everywhere), balanced by tokens.
    """
    n = len(data)
    if not dynamic:
        return [list(range(i, min(n, i + fixed_size))) for i in range(0, n, fixed_size)]
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    count = torch.tensor([num_micro_batches(lengths, max_tokens)], dtype=torch.int64)
    all_reduce(count, group, dist.ReduceOp.MAX)
    return pack_micro_batches(lengths, max_tokens, min_count=int(count.item()))


class DataParallelUpdater:
    """What the actor and the critic share: one data-parallel rank's module, its optimizer,
    the per-rank mini-batch size (samples) and the data-parallel group (``None`` = one rank)."""

    def __init__(
        self,
        config,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        mini_batch_size: int,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.group = group
        self.world_size = dist.get_world_size(group) if group is not None else 1


class DataParallelPPOActor(DataParallelUpdater):
    """The actor of one data-parallel rank (verl's ``DataParallelPPOActor``).

    Args:
        config: the actor block. ``ppo_mini_batch_size`` must already be in *samples per
            rank* (see :func:`local_mini_batch_size`).
        module: the FSDP2-sharded causal LM (or a plain one for a single process).
        optimizer: built by :func:`trainer_svc.fsdp.build_optimizer` (``None`` for a frozen
            reference policy). As in verl, the lr schedule is stepped by the caller once per
            training step, not here per mini-batch.
        group: the data-parallel process group (``None`` = no collectives, world size 1).
        off_policy: correction using ``rollout_log_probs``.
    """

    def __init__(
        self,
        config: ActorConfig,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        mini_batch_size: int,
        group: dist.ProcessGroup | None = None,
        off_policy: OffPolicyConfig | None = None,
    ) -> None:
        super().__init__(config, module, optimizer, mini_batch_size, group)
        self.off_policy = off_policy or OffPolicyConfig()
        self.loss_fn = core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)

    # ----------------------------------------------------------------------------- helpers

    def _all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        return all_reduce(t, self.group, op)

    def _micro_batches(self, data: DataProto, fixed_size: int, dynamic: bool, max_tokens: int) -> list[list[int]]:
        return micro_batch_indices(data, self.group, fixed_size, dynamic, max_tokens)

    def _loss_config(self, global_tokens: float, global_seqs: float) -> dict:
        c = self.config
        return {
            "clip_ratio": c.clip_ratio,
            "clip_ratio_low": c.clip_low,
            "clip_ratio_high": c.clip_high,
            "clip_ratio_c": c.clip_ratio_c,
            "loss_agg_mode": c.loss_agg_mode,
            "global_batch_info": self._global_info(global_tokens, global_seqs),
        }

    def _global_info(self, global_tokens: float, global_seqs: float) -> dict:
        return {"dp_size": self.world_size, "batch_num_tokens": global_tokens, "global_batch_size": global_seqs}

    # ----------------------------------------------------------------------------- log-probs

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of ``responses`` under the current weights.

        ``data.meta_info`` may carry ``micro_batch_size``, ``temperature``,
        ``use_dynamic_bsz`` and ``max_token_len`` (verl's keys); the config fills the rest.
        Returns float32 ``[B, R]`` tensors in the input row order. Collective under FSDP2:
        every rank must call it (with the same number of micro-batches -- guaranteed).
        """
        meta = data.meta_info
        micro = int(meta.get("micro_batch_size", self.config.log_prob_micro_batch_size_per_gpu))
        temperature = float(meta.get("temperature", 1.0))  # verl: the trainer puts rollout.temperature here
        dynamic = bool(meta.get("use_dynamic_bsz", self.config.use_dynamic_bsz))
        max_tokens = int(meta.get("max_token_len", self.config.log_prob_max_token_len_per_gpu))
        self.module.eval()
        n = len(data)
        parts = self._micro_batches(data, micro, dynamic, max_tokens)
        # Ranks hold equal row counts (ShardPlan pads), so fixed splits line up; guard anyway:
        # every rank must run the same number of forwards (FSDP2 all-gathers inside each).
        count = torch.tensor([len(parts)], dtype=torch.int64)
        self._all_reduce(count, dist.ReduceOp.MAX)
        if n == 0 and int(count.item()) > 0:
            raise ValueError("compute_log_prob: this rank has no rows but its peers do (use ShardPlan)")
        parts += [parts[-1]] * (int(count.item()) - len(parts))  # repeat work rather than desync
        r = data.batch["responses"].shape[1]
        log_probs = torch.zeros(n, r, dtype=torch.float32)
        entropys = torch.zeros(n, r, dtype=torch.float32) if calculate_entropy else None
        for idx in parts:
            ent, lp = self._run_forward(data, idx, temperature, calculate_entropy)
            log_probs[idx] = lp.cpu()
            if entropys is not None and ent is not None:
                entropys[idx] = ent.cpu()
        return log_probs, entropys

    def _run_forward(self, data: DataProto, idx: list[int], temperature: float, calculate_entropy: bool):
        index = torch.tensor(idx, dtype=torch.long)
        dev = next(iter(self.module.parameters())).device
        batch = {k: data.batch[k][index].to(dev) for k in _FORWARD_KEYS}
        return forward_log_probs(self.module, batch, temperature, calculate_entropy)

    # ----------------------------------------------------------------------------- update

    def update_policy(self, data: DataProto) -> UpdateResult:
        """PPO update over ``data`` (this rank's share of the training batch).

        Splits into mini-batches of ``mini_batch_size`` rows (one optimizer step each, for
        ``ppo_epochs`` passes), then micro-batches (fixed count or token budget) whose
        gradients accumulate. A mini-batch whose loss or gradient norm is NaN/inf is
        skipped: gradients are zeroed, the optimizer and lr schedule do not step, and the
        skip is counted (never silently applied). All ranks agree on every skip because
        the gradient norm is global.
        """
        if self.optimizer is None:
            raise RuntimeError("update_policy on an actor without an optimizer (a reference policy?)")
        c = self.config
        temperature = float(data.meta_info.get("temperature", 1.0))
        keys = list(_FORWARD_KEYS) + ["response_mask", "old_log_probs", "advantages"]
        if c.use_kl_loss:
            keys.append("ref_log_prob")
        use_rollout = self.off_policy.mode != "none"
        if use_rollout:
            if "rollout_log_probs" not in data.batch.keys():
                raise KeyError(f"off_policy.mode={self.off_policy.mode!r} needs rollout_log_probs in the batch")
            keys.append("rollout_log_probs")
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_policy: batch lacks {missing}")
        data = data.select(batch_keys=keys)
        self.module.train()
        result = UpdateResult()
        sums: dict[str, float] = {}
        n_mb = 0
        for _epoch in range(c.ppo_epochs):
            if c.shuffle:
                perm = torch.randperm(len(data))
                data = data.select_idxs(perm)
            for mini in data.split(self.mini_batch_size):
                stats = self._update_mini_batch(mini, temperature, use_rollout)
                n_mb += 1
                if stats.pop("skipped"):
                    result.skipped_steps += 1
                else:
                    result.optimizer_steps += 1
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
        self.optimizer.zero_grad(set_to_none=True)
        result.metrics = {k: v / max(1, n_mb) for k, v in sums.items()}
        return result

    def _update_mini_batch(self, mini: DataProto, temperature: float, use_rollout: bool) -> dict[str, float]:
        c = self.config
        mask_all = mini.batch["response_mask"]
        counts = torch.tensor([mask_all.sum().item(), (mask_all.sum(-1) > 0).sum().item()], dtype=torch.float64)
        self._all_reduce(counts)
        g_tokens, g_seqs = float(counts[0]), float(counts[1])
        loss_cfg = self._loss_config(g_tokens, g_seqs)
        ginfo = loss_cfg["global_batch_info"]
        parts = self._micro_batches(mini, c.ppo_micro_batch_size_per_gpu, c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu)
        self.optimizer.zero_grad(set_to_none=True)
        dev = next(iter(self.module.parameters())).device
        # Sums over micro-batches of globally-normalised terms; each rank's sum times
        # 1/world gives the mini-batch value after the all-reduce below.
        acc = {"actor/pg_loss": 0.0, "actor/entropy": 0.0, "actor/kl_loss": 0.0, "actor/loss": 0.0}
        # Token-weighted means of the loss function's own metrics.
        wmetrics: dict[str, float] = {}
        local_tokens = max(1.0, float(mask_all.sum()))
        finite = True
        for idx in parts:
            index = torch.tensor(idx, dtype=torch.long)
            mb = {k: v[index].to(dev) for k, v in mini.batch.items()}
            mask = mb["response_mask"]
            entropy, log_prob = forward_log_probs(
                self.module, mb, temperature, calculate_entropy=True, entropy_grad=c.entropy_coeff != 0
            )
            weights = None
            if use_rollout:
                weights = self._off_policy_weights(mb["old_log_probs"], mb["rollout_log_probs"], mask)
            pg_loss, pg_metrics = self._policy_loss(mb, log_prob, loss_cfg, weights)
            ent = core_algos.agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=c.loss_agg_mode, **ginfo)
            loss = pg_loss - c.entropy_coeff * ent if c.entropy_coeff != 0 else pg_loss
            kl = torch.zeros(())
            if c.use_kl_loss:
                kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=mb["ref_log_prob"], kl_penalty=c.kl_loss_type)
                kl = core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=c.loss_agg_mode, **ginfo)
                loss = loss + c.kl_loss_coef * kl
            if not torch.isfinite(loss.detach()):
                finite = False
            loss.backward()
            acc["actor/pg_loss"] += float(pg_loss.detach())
            acc["actor/entropy"] += float(ent.detach())
            acc["actor/kl_loss"] += float(kl.detach())
            acc["actor/loss"] += float(loss.detach())
            w = float(mask.sum()) / local_tokens
            for k, v in pg_metrics.items():
                wmetrics[k] = wmetrics.get(k, 0.0) + w * float(v)
        grad_norm = clip_grad_norm(self.module, c.grad_clip)
        flag = torch.tensor([0.0 if finite else 1.0])
        self._all_reduce(flag)
        skipped = bool(flag.item() > 0) or not bool(torch.isfinite(grad_norm))
        if skipped:
            logger.error(
                "non-finite loss or gradient norm (grad_norm=%s); skipping this optimizer step, weights unchanged",
                float(grad_norm),
            )
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        # Average the per-rank values over ranks in one collective.
        names = sorted(acc) + sorted(wmetrics)
        vec = torch.tensor([acc[k] for k in sorted(acc)] + [wmetrics[k] for k in sorted(wmetrics)], dtype=torch.float64)
        self._all_reduce(vec)
        vec /= self.world_size
        out = dict(zip(names, vec.tolist()))
        out["actor/grad_norm"] = float(grad_norm)
        out["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        out["skipped"] = skipped
        return out

    def _policy_loss(self, mb: dict, log_prob: torch.Tensor, loss_cfg: dict, weights: torch.Tensor | None):
        res = self.loss_fn(
            old_log_prob=mb["old_log_probs"],
            log_prob=log_prob,
            advantages=mb["advantages"],
            response_mask=mb["response_mask"],
            loss_agg_mode=self.config.loss_agg_mode,
            config=loss_cfg,
            rollout_is_weights=weights,
        )
        pg_loss, metrics = res
        return pg_loss, {k if "/" in k else f"actor/{k}": v for k, v in metrics.items()}

    def _off_policy_weights(self, old_log_prob: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor):
        """Importance weights ``pi_old / pi_rollout`` per token for the configured correction."""
        weights, _metrics = core_algos.compute_off_policy_weights(
            old_log_prob=old_log_prob,
            rollout_log_probs=rollout_log_probs,
            response_mask=mask,
            mode=self.off_policy.mode,
            cap=self.off_policy.cap,
        )
        return weights


def local_mini_batch_size(ppo_mini_batch_size: int, rollout_n: int, world_size: int) -> int:
    """verl's normalisation: prompts per mini-batch x samples per prompt / ranks."""
    total = ppo_mini_batch_size * rollout_n
    if total % world_size:
        raise ValueError(
            f"ppo_mini_batch_size*rollout_n = {total} samples does not divide over {world_size} ranks"
        )
    return total // world_size
