"""Trainer pieces in one process: log-probs vs a plain HF forward, micro-batching, sharding
plans, collation and the config schema."""

from __future__ import annotations

import pytest
import torch

from services.config.trainer import ActorConfig, AlgorithmConfig
from services.config.views import TrainerView
from trainer_svc.batching import ShardPlan, collate_groups
from trainer_svc.seqlen import balanced_partitions, num_micro_batches, pack_micro_batches
from trainer_svc.synthetic import make_batch, make_group


@pytest.fixture(scope="module")
def model(tiny_model):
    from trainer_svc.fsdp import load_causal_lm

    torch.manual_seed(0)
    return load_causal_lm(tiny_model)


def _actor(model, **cfg):
    from trainer_svc.actor import DataParallelPPOActor
    from trainer_svc.fsdp import build_optimizer

    c = ActorConfig(**{"ppo_mini_batch_size": 2, "optim": {"lr": 1e-3}, **cfg})
    opt, _ = build_optimizer(model, c.optim, 4)
    return DataParallelPPOActor(c, model, opt, mini_batch_size=8)


def _hf_log_probs(model, batch, temperature=1.0):
    """Log-probs and entropies of the responses from one plain forward over the padded batch;
    0 where a response has no token (the actor's convention for padding)."""
    r = batch.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch.batch["input_ids"],
            attention_mask=batch.batch["attention_mask"],
            position_ids=batch.batch["position_ids"],
        ).logits[:, -r - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, batch.batch["responses"].unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    token = batch.batch["attention_mask"][:, -r:].bool()
    return lp.where(token, 0.0), ent.where(token, 0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_compute_log_prob_matches_plain_hf_forward(model, temperature):
    batch = make_batch(3, n=2, prompt_len=7, response_len=5, vocab_size=model.config.vocab_size, seed=3)
    batch.meta_info["temperature"] = temperature
    actor = _actor(model, log_prob_micro_batch_size_per_gpu=4)
    lp, ent = actor.compute_log_prob(batch, calculate_entropy=True)
    ref_lp, ref_ent = _hf_log_probs(model, batch, temperature)
    assert lp.shape == (6, 5) and lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)


def test_dynamic_micro_batches_give_the_same_log_probs(model):
    batch = make_batch(4, n=2, prompt_len=9, response_len=6, vocab_size=model.config.vocab_size, seed=5)
    fixed, _ = _actor(model, log_prob_micro_batch_size_per_gpu=3).compute_log_prob(batch)
    batch.meta_info.update(use_dynamic_bsz=True, max_token_len=20)
    dynamic, _ = _actor(model).compute_log_prob(batch)
    torch.testing.assert_close(dynamic, fixed, atol=1e-5, rtol=1e-5)


def test_padding_columns_change_no_log_prob(model):
    """Extra all-padding columns (left of every prompt, right of every response) are cut
    before the forward: the same rows padded wider give the same log-probs."""
    narrow = make_batch(3, n=2, prompt_len=6, response_len=4, vocab_size=model.config.vocab_size, seed=7)
    wide = collate_groups([narrow, make_group("w", n=1, prompt_len=11, response_len=9, vocab_size=50, seed=8)])
    assert tuple(wide.batch["input_ids"].shape) == (7, 20)
    actor = _actor(model, log_prob_micro_batch_size_per_gpu=6)  # the wide row in a micro-batch of its own
    lp_wide, ent_wide = actor.compute_log_prob(wide, calculate_entropy=True)
    lp, ent = actor.compute_log_prob(narrow, calculate_entropy=True)
    torch.testing.assert_close(lp_wide[:6, :4], lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_wide[:6, :4], ent, atol=1e-5, rtol=1e-5)
    assert not lp_wide[:6, 4:].any() and not ent_wide[:6, 4:].any()
    ref_lp, _ = _hf_log_probs(model, narrow)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)


def test_update_policy_rejects_batches_missing_columns(model):
    batch = make_batch(1, n=2, prompt_len=4, response_len=3, vocab_size=model.config.vocab_size)
    with pytest.raises(KeyError, match="old_log_probs"):
        _actor(model).update_policy(batch)


def test_balanced_partitions_equal_sizes_and_balanced_tokens():
    lengths = [50, 3, 40, 7, 30, 12, 22, 9]
    parts = balanced_partitions(lengths, 2, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(8))
    assert [len(p) for p in parts] == [4, 4]
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert abs(sums[0] - sums[1]) <= 10  # naive halves would be 100 vs 73
    # zero-length rows never leave a partition empty
    assert all(balanced_partitions([0, 0, 0], 3, equal_size=False))


def test_token_budget_packing():
    lengths = [10, 10, 10, 5, 5]
    assert num_micro_batches(lengths, 20) == 2
    parts = pack_micro_batches(lengths, 20)
    assert all(sum(lengths[i] for i in p) <= 20 for p in parts)
    parts = pack_micro_batches(lengths, 20, min_count=4)  # a peer rank needs 4 passes
    assert len(parts) == 4 and sorted(i for p in parts for i in p) == list(range(5))
    assert num_micro_batches([100], 20) == 1  # an over-budget sample gets its own


def test_shard_plan_pads_masks_and_restores_order():
    batch = make_batch(5, n=1, prompt_len=4, response_len=3, vocab_size=50, seed=1)  # 5 rows over 2 ranks
    plan = ShardPlan.build(batch, 2)
    assert plan.per_rank == 3
    locals_ = [plan.local(batch, r) for r in range(2)]
    padded = [i for i in plan.order if i >= 5]
    assert len(padded) == 1
    pad_rank = plan.order.index(padded[0]) // 3
    pad_pos = plan.order.index(padded[0]) % 3
    assert int(locals_[pad_rank].batch["response_mask"][pad_pos].sum()) == 0  # padding trains nothing
    # a per-row result gathered back lands in the original order
    parts = [loc.batch["input_ids"][:, :1].float() for loc in locals_]
    full = torch.cat(parts)
    out = torch.empty_like(full)
    out[torch.tensor(plan.order)] = full
    torch.testing.assert_close(out[:5], batch.batch["input_ids"][:, :1].float())


def test_collate_groups_repads_prompts_left_and_responses_right():
    a = make_group("a", n=2, prompt_len=3, response_len=2, vocab_size=50, seed=1)
    b = make_group("b", n=1, prompt_len=5, response_len=4, vocab_size=50, seed=2)
    out = collate_groups([a, b], pad_id=0)
    assert tuple(out.batch["input_ids"].shape) == (3, 9)
    assert tuple(out.batch["responses"].shape) == (3, 4)
    # a's prompt tokens now end at column 5, its responses start there
    torch.testing.assert_close(out.batch["input_ids"][0, 2:5], a.batch["input_ids"][0, :3])
    torch.testing.assert_close(out.batch["responses"][:2, :2], a.batch["responses"])
    assert int(out.batch["attention_mask"][0, :2].sum()) == 0 and int(out.batch["response_mask"][0, 2:].sum()) == 0
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b"]
    with pytest.raises(ValueError, match="at least one"):
        collate_groups([])


def test_spec_is_strict_and_checks_batch_sizes():
    with pytest.raises(ValueError, match="ppo_mini_batch_sz"):
        TrainerView.model_validate({"model": {"path": "m"}, "data": {"train_batch_size": 4},
                                    "actor": {"ppo_mini_batch_sz": 2}})
    with pytest.raises(ValueError, match="exceeds data.train_batch_size"):
        TrainerView(model={"path": "m"}, data={"train_batch_size": 2}, actor={"ppo_mini_batch_size": 4})
    with pytest.raises(ValueError):
        ActorConfig(clip_ratio_c=0.5)  # dual-clip constant must exceed 1
    spec = TrainerView(model={"path": "m"}, data={"train_batch_size": 4}, actor={"ppo_mini_batch_size": 2, "use_kl_loss": True})
    assert spec.use_ref and not spec.use_critic
    assert TrainerView(model={"path": "m"}, data={"train_batch_size": 4}, algorithm=AlgorithmConfig(adv_estimator="gae"),
                       actor={"ppo_mini_batch_size": 4}).use_critic


def test_local_mini_batch_size_follows_verl():
    from trainer_svc.actor import local_mini_batch_size

    assert local_mini_batch_size(4, 8, 2) == 16
    with pytest.raises(ValueError, match="does not divide"):
        local_mini_batch_size(3, 1, 2)


def test_off_policy_correction_weights_the_policy_loss(tiny_model):
    """tis with rollout == old log-probs changes nothing; with pi_old/pi_rollout = e^5 every
    weight is capped at 2, doubling the policy-gradient loss."""
    from services.config.trainer import OffPolicyConfig
    from trainer_svc.actor import DataParallelPPOActor
    from trainer_svc.experience import compute_advantage
    from trainer_svc.fsdp import build_optimizer, load_causal_lm

    def pg_loss(mode: str, shift: float) -> float:
        model = load_causal_lm(tiny_model)
        cfg = ActorConfig(ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=8, optim={"lr": 1e-3})
        opt, _ = build_optimizer(model, cfg.optim, 2)
        actor = DataParallelPPOActor(cfg, model, opt, mini_batch_size=8, off_policy=OffPolicyConfig(mode=mode, cap=2.0))
        batch = make_batch(2, n=2, prompt_len=5, response_len=4, vocab_size=model.config.vocab_size, seed=9)
        batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
        batch.batch["rollout_log_probs"] = batch.batch["old_log_probs"] - shift
        compute_advantage(batch, AlgorithmConfig())
        return actor.update_policy(batch).metrics["actor/pg_loss"]

    base = pg_loss("none", 0.0)
    assert abs(base) > 1e-6
    assert pg_loss("tis", 0.0) == pytest.approx(base, rel=1e-6)
    assert pg_loss("tis", 5.0) == pytest.approx(2 * base, rel=1e-5)
    with pytest.raises(KeyError, match="rollout_log_probs"):
        model = load_causal_lm(tiny_model)
        opt, _ = build_optimizer(model, ActorConfig().optim, 1)
        actor = DataParallelPPOActor(ActorConfig(), model, opt, mini_batch_size=4,
                                     off_policy=OffPolicyConfig(mode="decoupled"))
        b = make_batch(1, n=2, prompt_len=4, response_len=3, vocab_size=model.config.vocab_size)
        del b.batch["rollout_log_probs"]
        actor.update_policy(b)
