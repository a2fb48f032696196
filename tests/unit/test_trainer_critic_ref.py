"""Critic, reference policy and KL paths of the trainer, in one process on the tiny model."""

from __future__ import annotations

import pytest
import torch

from services.config.trainer import ActorConfig, AlgorithmConfig, CriticConfig, RefConfig
from trainer_svc.synthetic import make_batch


@pytest.fixture
def batch(tiny_model):
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_model).vocab_size
    return make_batch(2, n=2, prompt_len=5, response_len=4, vocab_size=vocab, seed=11)


def test_critic_values_are_masked_and_training_reduces_value_loss(tiny_model, batch):
    from trainer_svc.critic import DataParallelPPOCritic
    from trainer_svc.fsdp import build_optimizer, load_value_model

    torch.manual_seed(0)
    model = load_value_model(tiny_model)
    cfg = CriticConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2, optim={"lr": 3e-3})
    opt, _ = build_optimizer(model, cfg.optim, 20)
    critic = DataParallelPPOCritic(cfg, model, opt, mini_batch_size=4)
    values = critic.compute_values(batch)
    mask = batch.batch["response_mask"]
    assert values.shape == mask.shape and values.dtype == torch.float32
    assert torch.all(values[mask == 0] == 0)
    batch.batch["returns"] = mask.float()  # target value 1 on every response token
    losses = []
    for _ in range(6):
        batch.batch["values"] = critic.compute_values(batch)
        losses.append(critic.update_critic(batch)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


def test_gae_advantages_need_values(batch):
    from trainer_svc.experience import compute_advantage

    with pytest.raises(ValueError, match="values"):
        compute_advantage(batch, AlgorithmConfig(adv_estimator="gae"))
    batch.batch["values"] = torch.zeros_like(batch.batch["token_level_scores"])
    compute_advantage(batch, AlgorithmConfig(adv_estimator="gae", gamma=1.0, lam=1.0))
    # gamma = lam = 1, zero values: the return of every valid token is the sequence score
    mask = batch.batch["response_mask"].bool()
    score = batch.batch["token_level_scores"].sum(-1, keepdim=True).expand_as(mask)
    torch.testing.assert_close(batch.batch["returns"][mask], score[mask])


def test_kl_loss_starts_at_zero_and_grows_as_the_policy_moves(tiny_model, batch):
    from trainer_svc.actor import DataParallelPPOActor
    from trainer_svc.experience import compute_advantage
    from trainer_svc.fsdp import build_optimizer, load_causal_lm
    from trainer_svc.ref import ReferencePolicy

    actor_model, ref_model = load_causal_lm(tiny_model), load_causal_lm(tiny_model)
    cfg = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=4, use_kl_loss=True, kl_loss_coef=0.1,
                      optim={"lr": 1e-2})
    opt, _ = build_optimizer(actor_model, cfg.optim, 10)
    actor = DataParallelPPOActor(cfg, actor_model, opt, mini_batch_size=4)
    ref = ReferencePolicy(ref_model, cfg, RefConfig())
    kl = []
    for _ in range(3):
        batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
        batch.batch["ref_log_prob"] = ref.compute_ref_log_prob(batch)
        compute_advantage(batch, AlgorithmConfig())
        kl.append(actor.update_policy(batch).metrics["actor/kl_loss"])
    assert abs(kl[0]) < 1e-6
    assert kl[2] > 1e-5
    assert not any(p.requires_grad for p in ref_model.parameters())


def test_kl_in_reward_changes_rewards(batch):
    from trainer_svc import core_algos
    from trainer_svc.experience import compute_advantage

    algo = AlgorithmConfig(use_kl_in_reward=True, kl_ctrl={"type": "fixed", "kl_coef": 0.5})
    batch.batch["old_log_probs"] = torch.full_like(batch.batch["token_level_scores"], -1.0)
    batch.batch["ref_log_prob"] = torch.full_like(batch.batch["token_level_scores"], -2.0)
    _, metrics = compute_advantage(batch, algo, core_algos.get_kl_controller(algo.kl_ctrl))
    mask = batch.batch["response_mask"].bool()
    diff = batch.batch["token_level_scores"] - batch.batch["token_level_rewards"]
    torch.testing.assert_close(diff[mask], torch.full_like(diff[mask], 0.5))  # beta * (old - ref)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
