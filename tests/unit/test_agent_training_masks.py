"""Multi-turn samples in the trainer: only model tokens (``response_mask`` 1) count.

A trajectory's observation tokens are attended (``attention_mask`` 1) but masked out of
training (``response_mask`` 0). Whatever sits on those positions -- advantages,
recomputed and rollout log-probs -- must not change the update: the policy loss, the
entropy and KL terms, the advantages and the off-policy weights all use ``response_mask``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from services.config.trainer import ActorConfig, AlgorithmConfig, OffPolicyConfig
from trainer_svc.synthetic import make_batch


def _multi_turn(batch):
    """Turn each response into model / observation / model: positions 2..4 are an observation."""
    b = batch.batch
    r = b["responses"].shape[1]
    b["attention_mask"][:, -r:] = 1  # every response position is a real token
    b["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    mask = torch.ones_like(b["response_mask"])
    mask[:, 2:5] = 0
    b["response_mask"] = mask
    b["rollout_log_probs"] = torch.where(mask.bool(), b["rollout_log_probs"], torch.full_like(b["rollout_log_probs"], -1.0))
    scores = torch.zeros_like(b["token_level_scores"])
    scores[:, -1] = torch.arange(len(batch)) % 2  # the score sits on the last (model) token
    b["token_level_scores"] = scores
    return batch


@pytest.mark.parametrize("mode", ["none", "tis", "decoupled"])
def test_observation_tokens_do_not_change_the_update(tiny_model, mode):
    from trainer_svc.actor import DataParallelPPOActor
    from trainer_svc.experience import compute_advantage
    from trainer_svc.fsdp import build_optimizer, load_causal_lm

    torch.manual_seed(0)
    base = load_causal_lm(tiny_model)
    batch = _multi_turn(make_batch(2, n=4, prompt_len=6, response_len=10, vocab_size=base.config.vocab_size, seed=1))
    batch, _ = compute_advantage(batch, AlgorithmConfig(adv_estimator="grpo"))
    obs = batch.batch["response_mask"] == 0
    assert torch.all(batch.batch["advantages"][obs] == 0)
    assert torch.any(batch.batch["advantages"][~obs] != 0)

    def update(data):
        model = copy.deepcopy(base)
        cfg = ActorConfig(ppo_mini_batch_size=2, entropy_coeff=0.01, use_kl_loss=True, optim={"lr": 1e-2})
        opt, _ = build_optimizer(model, cfg.optim, 4)
        actor = DataParallelPPOActor(cfg, model, opt, mini_batch_size=8, off_policy=OffPolicyConfig(mode=mode))
        old, _ = actor.compute_log_prob(data)
        data.batch["old_log_probs"] = old
        data.batch["ref_log_prob"] = old.clone()
        res = actor.update_policy(data)
        assert res.optimizer_steps == 1
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    clean = update(copy.deepcopy(batch))
    dirty = copy.deepcopy(batch)
    # garbage on observation positions (the -1 pad and anything else must be ignored)
    dirty.batch["advantages"] = torch.where(obs, torch.full_like(dirty.batch["advantages"], 50.0),
                                            dirty.batch["advantages"])
    dirty.batch["rollout_log_probs"] = torch.where(obs, torch.full_like(dirty.batch["rollout_log_probs"], -30.0),
                                                   dirty.batch["rollout_log_probs"])
    after_dirty = update(dirty)
    torch.testing.assert_close(after_dirty, clean, atol=0, rtol=0)
    # and the update is not a no-op
    assert not torch.equal(clean, torch.cat([p.detach().flatten() for p in base.parameters()]))
