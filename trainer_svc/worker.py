"""One trainer rank: models, optimizers and the SPMD training step.

Every rank holds the whole training batch (rank 0 broadcast it) and runs the same code:

1. ``ShardPlan``: pad to a multiple of the world size, deal rows so every rank gets the
   same number of rows and about the same number of tokens;
2. recompute ``old_log_probs`` (and ``ref_log_prob`` / critic ``values`` when needed) on
   the local rows, all-gather them back into the full batch;
3. compute advantages on the full batch (deterministic, identical on every rank);
4. update the critic and the actor on the local rows (FSDP2 reduce-scatters gradients).

The policy version counts committed steps that changed the weights: a step whose every
optimizer step was skipped for a non-finite loss leaves the version (and the weights)
unchanged and is reported as such.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from services.config.views import TrainerView
from services.protocol import DataProto
from trainer_svc import core_algos
from trainer_svc.actor import DataParallelPPOActor, local_mini_batch_size
from trainer_svc.batching import ShardPlan
from trainer_svc.critic import DataParallelPPOCritic
from trainer_svc.experience import compute_advantage
from trainer_svc.fsdp import (DistContext, ShardCopy, build_optimizer, iter_full_params, load_causal_lm, load_value_model,
                              shard_model, swapped_params)
from trainer_svc.lora import adapter_disabled, apply_lora, iter_adapter_tensors
from trainer_svc.promotion.base import PromotionPolicy
from trainer_svc.ref import ReferencePolicy

logger = logging.getLogger(__name__)


def rollout_mismatch_metrics(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                             mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's probabilities of the sampled tokens are from the replica's
    (verl's ``training/rollout_probs_diff_*``), and the mean ``|log p_trainer - log p_rollout|``
    (``training/rollout_logprob_gap_mean``, what a judged candidate is measured by): with ``max_staleness=0``
    these measure the numerical gap between the two engines; otherwise they include the policy
    change."""
    m = mask.bool()
    if not m.any():
        return {}
    diff = (old_log_probs.float().exp() - rollout_log_probs.float().exp()).abs()[m]
    gap = (old_log_probs.float() - rollout_log_probs.float()).abs()[m]  # what a candidate is judged by
    return {"training/rollout_probs_diff_mean": float(diff.mean()), "training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_logprob_gap_mean": float(gap.mean())}


@dataclass
class StepResult:
    """Outcome of one training step on this rank (metrics are identical on all ranks).

    ``version``: the policy version after the step. ``applied``: at least one optimizer
    step changed the weights. ``skipped_steps``: optimizer steps skipped for NaN/inf.
    ``seconds``: phase timings (``logprob``, ``adv``, ``update``).
    """

    version: int
    applied: bool
    samples: int
    tokens: int
    optimizer_steps: int
    skipped_steps: int
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    verdict: dict | None = None
    """The promotion policy's verdict on a candidate version whose samples the batch carried."""
    removed: torch.Tensor | None = None
    """Bool per batch row: left out of the update (a rejected candidate's; a candidate's too stale)."""

    @property
    def canary(self) -> dict | None:
        """:attr:`verdict`, under the name it had when the canary was the only policy that judges."""
        return self.verdict


class TrainerWorker:
    """Builds the actor (and reference / critic) for one rank from the spec.

    Model collectives (FSDP2 all-gather / reduce-scatter) run on the device mesh's group
    (nccl on GPU); the host-side ones the actor and the shard plan issue on CPU tensors
    (token counts, NaN flags, metrics, gathered log-probs) run on ``ctx.cpu_group`` (gloo).
    """

    def __init__(self, spec: TrainerView, ctx: DistContext) -> None:
        self.spec = spec
        self.ctx = ctx
        torch.manual_seed(spec.trainer.seed)
        a = spec.actor
        model = load_causal_lm(spec.model.path, spec.model.dtype, device=ctx.device)
        if a.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if spec.model.lora:  # a PEFT adapter, base frozen: the optimizer below holds only the adapter
            model = apply_lora(model, spec.model)
        reshard, mp = a.fsdp_config.reshard_after_forward, a.fsdp_config.mixed_precision
        self.model = shard_model(model, ctx.mesh, reshard_after_forward=reshard, mixed_precision=mp)
        # As in verl, the schedule advances once per training step (policy version).
        self.optimizer, self.lr_scheduler = build_optimizer(self.model, a.optim, spec.trainer.total_steps)
        self.actor = DataParallelPPOActor(
            a,
            self.model,
            self.optimizer,
            mini_batch_size=local_mini_batch_size(a.ppo_mini_batch_size, spec.rollout.n, ctx.world_size),
            group=ctx.cpu_group,
            off_policy=spec.algorithm.off_policy,
        )
        self.ref: ReferencePolicy | None = None
        if spec.use_ref and spec.model.lora:  # the base policy is the actor with its adapter off
            self.ref = ReferencePolicy(self.model, a, spec.ref, group=ctx.cpu_group,
                                       adapter_off=lambda: adapter_disabled(self.model))
        elif spec.use_ref:
            # forward-only: always free gathered parameters after each layer
            ref_model = shard_model(load_causal_lm(spec.model.path, spec.model.dtype, device=ctx.device), ctx.mesh,
                                    mixed_precision=mp)
            self.ref = ReferencePolicy(ref_model, a, spec.ref, group=ctx.cpu_group)
        self.critic: DataParallelPPOCritic | None = None
        self.critic_optimizer = self.critic_scheduler = None
        if spec.use_critic:
            c = spec.critic
            vmodel = shard_model(load_value_model(c.model_path or spec.model.path, spec.model.dtype, device=ctx.device),
                                 ctx.mesh, mixed_precision=mp)
            self.critic_optimizer, self.critic_scheduler = build_optimizer(vmodel, c.optim, spec.trainer.total_steps)
            self.critic = DataParallelPPOCritic(
                c,
                vmodel,
                self.critic_optimizer,
                mini_batch_size=local_mini_batch_size(c.ppo_mini_batch_size, spec.rollout.n, ctx.world_size),
                group=ctx.cpu_group,
            )
        self.kl_ctrl = core_algos.get_kl_controller(spec.algorithm.kl_ctrl) if spec.algorithm.use_kl_in_reward else None
        self.version = 0
        self.offered: ShardCopy | None = None
        """This rank's shards of the weights last offered as a candidate (:meth:`keep_offered`),
        to judge the candidate with its own weights."""
        self.policy: PromotionPolicy | None = None
        """The trainer's promotion policy (:mod:`trainer_svc.promotion`), set by the trainer's
        loop; its ``judge`` hook runs inside :meth:`step`. Unset (a bare worker): the base
        policy, which judges a batch marked with a candidate and nothing else."""

    def _policy(self) -> PromotionPolicy:
        if self.policy is None:
            self.policy = PromotionPolicy(self.spec.async_.max_staleness)
        return self.policy

    # ------------------------------------------------------------------------------ step

    def step(self, batch: DataProto, on_verdict: Callable[[dict, torch.Tensor], None] | None = None,
             after_verdict: Callable[[dict], None] | None = None) -> StepResult:
        """One training step on the full batch (identical on every rank). Collective.

        A batch that judges a candidate version reaches its verdict (the promotion policy's
        ``judge`` hook) once the old log-probs are recomputed, before the updates:
        ``on_verdict(verdict, removed)`` (rank 0's decision) is called then, so a promoted
        version goes to the other replicas while this step is still updating, not a step
        later. ``after_verdict(verdict)`` follows on every rank, the parameters still the
        step's starting ones: the trainer may gather them there (a collective) to offer them
        as the next candidate."""
        if len(batch) == 0:
            raise ValueError("empty training batch")
        ctx, spec = self.ctx, self.spec
        t0 = time.perf_counter()
        batch.meta_info.setdefault("temperature", spec.rollout.temperature or 1.0)  # 0 = greedy: logits as they are
        plan = ShardPlan.build(batch, ctx.world_size)
        local = plan.local(batch, ctx.rank)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = core_algos.compute_response_mask(batch)
        metrics = self._old_log_probs(batch, plan, local)
        verdict = removed = None
        found = self._policy().judge(batch, self)
        if found is not None:
            verdict, removed = found
            if on_verdict is not None:
                on_verdict(verdict, removed)
            if after_verdict is not None:
                after_verdict(verdict)
            if bool(removed.any()):
                batch = batch.select_idxs(~removed)
                if len(batch) == 0:
                    return StepResult(self.version, False, 0, 0, 0, 0, metrics, verdict=verdict, removed=removed)
                plan = ShardPlan.build(batch, ctx.world_size)
                local = plan.local(batch, ctx.rank)
        if self.ref is not None:
            batch.batch["ref_log_prob"] = plan.gather(self.ref.compute_ref_log_prob(local), ctx.cpu_group)
        if self.critic is not None:
            batch.batch["values"] = plan.gather(self.critic.compute_values(local), ctx.cpu_group)
        t1 = time.perf_counter()
        batch, adv_metrics = compute_advantage(batch, spec.algorithm, self.kl_ctrl)
        metrics.update(adv_metrics)
        t2 = time.perf_counter()
        local = plan.local(batch, ctx.rank)
        if self.critic is not None:
            critic_metrics = self.critic.update_critic(local)
            metrics.update(critic_metrics)
            if critic_metrics["critic/optimizer_steps"] > 0:
                self.critic_scheduler.step()
        result = self.actor.update_policy(local)
        t3 = time.perf_counter()
        metrics.update(result.metrics)
        applied = result.optimizer_steps > 0
        if applied:
            self.version += 1
            self.lr_scheduler.step()
        mask = batch.batch["response_mask"]
        return StepResult(
            version=self.version,
            applied=applied,
            samples=len(batch),
            tokens=int(batch.batch["attention_mask"].sum()),
            optimizer_steps=result.optimizer_steps,
            skipped_steps=result.skipped_steps,
            metrics={**metrics, "response_length/mean": float(mask.sum(-1).float().mean())},
            seconds={"logprob": t1 - t0, "adv": t2 - t1, "update": t3 - t2},
            verdict=verdict,
            removed=removed,
        )

    def keep_offered(self) -> None:
        """The current weights are being offered as a candidate (the policy's ``on_publish``): keep a copy of
        this rank's shards of them, replacing the last, so the step that judges the
        candidate -- usually a step or two later -- can recompute its samples' log-probs with
        the very weights the candidate's replicas served (:meth:`_candidate_log_probs`). Costs one more
        copy of the local parameter shards. Every rank calls it on the same publishes."""
        self.offered = ShardCopy.of(self.model, self.version)

    def _candidate_log_probs(self, batch: DataProto, version: int) -> tuple[torch.Tensor, int] | None:
        """The log-probs that judge candidate ``version``, and the lag they were computed at
        (versions between the weights used and the candidate's): ``batch``'s
        ``old_log_probs`` with the candidate's rows recomputed with the candidate's own
        weights (:attr:`offered`) when the trainer has stepped past them -- lag 0, so the
        gap measures how a replica served the weights, not how far the policy moved since
        (one step's change was seen to reject healthy versions). None when the candidate's
        weights are not kept: judged with the current ones, at ``self.version - version``.
        Collective: every rank holds the same batch and copy, so all take the same path."""
        if version == self.version:
            return batch.batch["old_log_probs"], 0  # the current weights are the candidate's
        if self.offered is None or self.offered.version != version:
            return None
        rows = torch.nonzero(batch.batch["policy_version"].long().reshape(-1) == version).reshape(-1)
        judged = batch.batch["old_log_probs"].clone()
        if len(rows):
            sub = batch.select_idxs(rows)
            sub_plan = ShardPlan.build(sub, self.ctx.world_size)
            with swapped_params(self.model, self.offered):
                lp, _ = self.actor.compute_log_prob(sub_plan.local(sub, self.ctx.rank))
            judged[rows] = sub_plan.gather(lp, self.ctx.cpu_group).to(judged.dtype)
        return judged, 0

    def _fresh_rows(self, batch: DataProto) -> torch.Tensor | None:
        """``actor.recompute_old_log_prob: stale``: bool per row whose old log-probs are the
        replica's (the trainer's current weights generated it); None when every row is recomputed."""
        b = batch.batch
        if (self.spec.actor.recompute_old_log_prob != "stale" or "rollout_log_probs" not in b.keys()
                or "policy_version" not in b.keys() or self._policy().judges(batch)):
            return None
        fresh = b["policy_version"].long().reshape(-1) == self.version
        return fresh if bool(fresh.any()) else None

    def _old_log_probs(self, batch: DataProto, plan: ShardPlan, local: DataProto) -> dict[str, float]:
        """Put ``old_log_probs`` into ``batch`` (recomputed by the trainer, or for fresh rows the
        replica's, see :meth:`_fresh_rows`); returns the old-entropy and trainer-vs-replica
        metrics over the recomputed rows. Collective: every rank holds the same batch, so all
        take the same path."""
        ctx, b = self.ctx, batch.batch
        fresh = self._fresh_rows(batch)
        metrics: dict[str, float] = {}
        if fresh is None:
            rows, sub, sub_plan, sub_local = None, batch, plan, local
        else:
            metrics["actor/old_log_prob_reused"] = float(fresh.float().mean())
            b["old_log_probs"] = b["rollout_log_probs"].to(torch.float32).clone()
            rows = torch.nonzero(~fresh).reshape(-1)
            if not len(rows):
                return metrics  # every row on-policy: no forward pass at all
            sub = batch.select_idxs(rows)
            sub_plan = ShardPlan.build(sub, ctx.world_size)
            sub_local = sub_plan.local(sub, ctx.rank)
        old_lp, entropy = self.actor.compute_log_prob(sub_local, calculate_entropy=True)
        old = sub_plan.gather(old_lp, ctx.cpu_group)
        if rows is None:
            b["old_log_probs"] = old
        else:
            b["old_log_probs"][rows] = old.to(torch.float32)
        mask = sub.batch["response_mask"]
        if entropy is not None:
            full_ent = sub_plan.gather(entropy, ctx.cpu_group)
            metrics["actor/old_entropy"] = float(core_algos.masked_mean(full_ent, mask))
        if "rollout_log_probs" in sub.batch.keys():
            metrics.update(rollout_mismatch_metrics(old, sub.batch["rollout_log_probs"], mask))
        return metrics

    # ------------------------------------------------------------------------------ weights

    def full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` per parameter, gathered one at a time. Collective:
        every rank must drain it (rank 0 feeds the publisher, the others discard). With LoRA,
        the adapter's tensors only, by PEFT's saved names (what the replicas load)."""
        if self.spec.model.lora:
            return iter_adapter_tensors(self.model)
        return iter_full_params(self.model)
