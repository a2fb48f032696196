"""Covariance-selected losses (Clip-Cov, KL-Cov): a small share of tokens, chosen by the
covariance between their advantage and log-prob, get their gradient cut (``clip_cov``) or
a KL penalty (``kl_cov``), to keep the policy's entropy from collapsing.

Signature: :mod:`trainer_svc.algos.policy_loss_common`. Defaults of ``policy_loss.*`` as
verl's ``PolicyLossConfig``: ``clip_cov_ratio`` 2e-4, ``clip_cov_lb`` 1.0, ``clip_cov_ub``
5.0, ``kl_cov_ratio`` 2e-4, ``ppo_kl_coef`` 0.1.
"""

from __future__ import annotations

import torch

from trainer_svc.algos.functional import masked_mean
from trainer_svc.algos.policy_loss_common import aggregate, clip_ranges, policy_loss, policy_loss_setting

__all__ = [
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
]


@policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                                 rollout_is_weights):
    """Clip-Cov: PPO clipping, plus the gradient of a random ``clip_cov_ratio`` share of
    tokens whose advantage/log-prob covariance lies in ``(clip_cov_lb, clip_cov_ub)`` is
    cut. Uses the global torch RNG (``torch.randperm``), as verl does."""
    ratio_share = policy_loss_setting(config, "clip_cov_ratio", 0.0002)
    lower = policy_loss_setting(config, "clip_cov_lb", 1.0)
    upper = policy_loss_setting(config, "clip_cov_ub", 5.0)
    if not ratio_share > 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be positive, got {ratio_share}")
    low, high, _ = clip_ranges(config)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clipped_by_ppo = (losses2 > losses1) & (response_mask > 0)
    cov = (advantages - masked_mean(advantages, response_mask)) * (
        log_prob - masked_mean(log_prob.detach(), response_mask)
    )
    cov = cov.masked_fill((response_mask == 0) | clipped_by_ppo, -torch.inf)
    budget = max(int(ratio_share * response_mask.sum().item()), 1)
    candidates = torch.nonzero((cov < upper) & (cov > lower) & (response_mask > 0))
    if len(candidates) > 0:
        candidates = candidates[torch.randperm(len(candidates))[: min(budget, len(candidates))]]
    corr = torch.ones_like(advantages)
    corr[candidates[:, 0], candidates[:, 1]] = 0
    pg_losses = torch.maximum(losses1, losses2) * corr
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    clipfrac = masked_mean((corr == 0).float(), response_mask)
    return pg_loss, {"actor/pg_clipfrac": float(clipfrac), "actor/ppo_kl": float(ppo_kl.detach())}


@policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                               rollout_is_weights):
    """KL-Cov: unclipped ``-A * ratio``, plus ``ppo_kl_coef * |log ratio|`` on the top
    ``kl_cov_ratio`` share of valid tokens by advantage/log-prob covariance."""
    share = policy_loss_setting(config, "kl_cov_ratio", 0.0002)
    coef = policy_loss_setting(config, "ppo_kl_coef", 0.1)
    if not share > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be positive, got {share}")
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * ratio
    valid = response_mask > 0
    flat_valid = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    if flat_valid.numel() > 0:
        adv_v = advantages[valid].detach().reshape(-1)
        logp_v = log_prob[valid].detach().reshape(-1)
        cov = (adv_v - adv_v.mean()) * (logp_v - logp_v.mean())
        top = torch.topk(cov, max(1, int(len(cov) * share)), largest=True).indices
        rows, cols = flat_valid[top] // advantages.shape[1], flat_valid[top] % advantages.shape[1]
        penalised = pg_losses.clone()
        penalised[rows, cols] = pg_losses[rows, cols] + coef * abs_kl[rows, cols]
        pg_losses = penalised
    pg_loss = aggregate(pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"actor/ppo_kl": float(masked_mean(abs_kl, response_mask).detach())}
