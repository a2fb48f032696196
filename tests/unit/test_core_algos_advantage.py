"""Advantage estimators of trainer_svc.core_algos on worked examples computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from services.protocol import DataProto
from trainer_svc import core_algos as ca

F64 = torch.float64


def outcome(
    scores: list[float], length: int = 4, lengths: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards [B, length] with each score on the last valid token, and the response mask."""
    lengths = lengths or [length] * len(scores)
    rewards = torch.zeros(len(scores), length, dtype=F64)
    mask = torch.zeros(len(scores), length, dtype=F64)
    for i, (score, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = score
    return rewards, mask


def per_seq(adv: torch.Tensor) -> list[float]:
    """The first-token advantage of each response (outcome advantages are constant)."""
    return adv[:, 0].tolist()


# --- GRPO ----------------------------------------------------------------------------


def test_grpo_worked_example_unbiased_std_and_epsilon() -> None:
    # verl's docs example: two prompts, three responses each. Group "a" has rewards
    # [1, 0, 1]: mean 2/3, unbiased std sqrt(((1/3)^2*2 + (2/3)^2)/2) = sqrt(1/3).
    rewards, mask = outcome([1, 0, 1, 1, 0, 0])
    index = np.array(["a", "a", "a", "b", "b", "b"], dtype=object)
    adv, ret = ca.compute_grpo_outcome_advantage(rewards, mask, index)
    std = math.sqrt(1 / 3)
    eps = 1e-6
    expected = [
        (1 - 2 / 3) / (std + eps),
        (0 - 2 / 3) / (std + eps),
        (1 - 2 / 3) / (std + eps),
        (1 - 1 / 3) / (std + eps),
        (0 - 1 / 3) / (std + eps),
        (0 - 1 / 3) / (std + eps),
    ]
    assert per_seq(adv) == pytest.approx(expected, abs=1e-12)
    assert per_seq(adv)[0] == pytest.approx(0.57735, abs=1e-5)
    assert per_seq(adv)[1] == pytest.approx(-1.15470, abs=1e-5)
    assert torch.equal(adv, ret)
    # broadcast over every response token
    assert torch.allclose(adv, adv[:, :1].expand_as(adv))


def test_grpo_masks_padding_and_sums_token_rewards() -> None:
    rewards, mask = outcome([2.0, 0.0], length=5, lengths=[2, 5])
    rewards[0, 0] = 1.0  # a process reward: the score is the sum, 3.0
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, np.array([7, 7]))
    scale = 3.0 / 2 / (math.sqrt(4.5) + 1e-6)  # mean 1.5, unbiased std sqrt(4.5)
    assert adv[0, :2].tolist() == pytest.approx([scale, scale])
    assert adv[0, 2:].tolist() == [0.0, 0.0, 0.0]
    assert adv[1].tolist() == pytest.approx([-scale] * 5)


def test_grpo_edge_cases_singleton_equal_rewards_all_masked_rows() -> None:
    rewards, mask = outcome([0.7, 1.0, 1.0, 0.0, 1.0])
    mask[3] = 0  # an all-masked row (a response with no valid token)
    index = ["solo", "same", "same", "x", "x"]
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, index)
    assert torch.isfinite(adv).all()
    # a singleton group has mean 0 and std 1: advantage = score / (1 + eps), where, as in
    # verl, the std is a float32 tensor so 1 + eps is rounded to float32
    one_plus_eps = float(np.float32(1.0) + np.float32(1e-6))
    assert adv[0, 0].item() == pytest.approx(0.7 / one_plus_eps, abs=1e-12)
    # all-equal rewards: std 0, advantage 0 (not NaN) thanks to epsilon
    assert adv[1].abs().max().item() == 0.0 and adv[2].abs().max().item() == 0.0
    assert adv[3].abs().max().item() == 0.0
    vec, _ = ca.compute_grpo_vectorized_outcome_advantage(rewards, mask, index)
    assert torch.isfinite(vec).all()
    assert torch.allclose(vec, adv, atol=1e-6)


def test_dr_grpo_does_not_divide_by_std() -> None:
    rewards, mask = outcome([1, 0, 1, 1, 0, 0])
    index = np.array([0, 0, 0, 1, 1, 1])
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert per_seq(adv) == pytest.approx([1 / 3, -2 / 3, 1 / 3, 2 / 3, -1 / 3, -1 / 3])
    vec, _ = ca.compute_grpo_vectorized_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(vec, adv)


def test_grpo_vectorized_matches_loop_on_random_groups() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, 6, generator=gen, dtype=F64)
    mask = (torch.rand(24, 6, generator=gen) > 0.3).to(F64)
    mask[:, 0] = 1
    index = np.array([f"uid{i % 5}" for i in range(23)] + ["lonely"], dtype=object)
    loop, _ = ca.compute_grpo_outcome_advantage(rewards, mask, index)
    vec, _ = ca.compute_grpo_vectorized_outcome_advantage(rewards, mask, index)
    # the vectorized form keeps the group statistics in float32, as verl does
    assert torch.allclose(loop, vec, atol=1e-5)
    assert not torch.equal(loop, torch.zeros_like(loop))


def test_grpo_rejects_index_of_wrong_length() -> None:
    rewards, mask = outcome([1, 0])
    with pytest.raises(ValueError, match="index has 3 entries"):
        ca.compute_grpo_outcome_advantage(rewards, mask, ["a", "a", "b"])
    with pytest.raises(ValueError, match="response_length"):
        ca.compute_grpo_outcome_advantage(rewards, mask[:, :2], ["a", "a"])


# --- other estimators -------------------------------------------------------------------


def test_rloo_leave_one_out_and_singletons() -> None:
    rewards, mask = outcome([1, 0, 1, 0.4])
    index = ["p", "p", "p", "q"]
    loop, _ = ca.compute_rloo_outcome_advantage(rewards, mask, index)
    # s_i - mean of the other two: 1 - 0.5, 0 - 1, 1 - 0.5; the singleton keeps its score
    assert per_seq(loop) == pytest.approx([0.5, -1.0, 0.5, 0.4])
    vec, _ = ca.compute_rloo_vectorized_outcome_advantage(rewards, mask, index)
    # the vectorized form zeroes singleton groups (verl's behaviour)
    assert per_seq(vec) == pytest.approx([0.5, -1.0, 0.5, 0.0])


def test_grpo_passk_only_best_response_gets_advantage() -> None:
    rewards, mask = outcome([0.2, 0.9, 0.5, 1.0, 0.0])
    index = ["a", "a", "a", "b", "b"]
    adv, _ = ca.compute_grpo_passk_outcome_advantage(rewards, mask, index, config={"norm_adv_by_std_in_grpo": False})
    assert per_seq(adv) == pytest.approx([0.0, 0.4, 0.0, 1.0, 0.0])
    adv_n, _ = ca.compute_grpo_passk_outcome_advantage(rewards, mask, index, config={})
    std_a = torch.tensor([0.2, 0.9, 0.5], dtype=F64).std().item()
    assert per_seq(adv_n)[1] == pytest.approx(0.4 / (std_a + 1e-6))
    with pytest.raises(ValueError, match="at least 2"):
        ca.compute_grpo_passk_outcome_advantage(rewards[:1], mask[:1], ["a"], config={})


def _whiten(values: list[float]) -> list[float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def test_reinforce_plus_plus_baseline_centres_then_whitens() -> None:
    rewards, mask = outcome([1, 0, 3, 1], length=2)
    adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, ["a", "a", "b", "b"])
    centred = [0.5, -0.5, 1.0, -1.0]
    expected = _whiten([c for c in centred for _ in range(2)])
    assert adv.flatten().tolist() == pytest.approx(expected)


def test_reinforce_plus_plus_discounted_returns() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=F64)
    adv, returns = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={"gamma": 0.5})
    assert returns[0, :3].tolist() == pytest.approx([0.25, 0.5, 1.0])
    assert returns[1, :2].tolist() == pytest.approx([1.0, 2.0])
    valid = [0.25, 0.5, 1.0, 1.0, 2.0]
    got = [adv[0, 0], adv[0, 1], adv[0, 2], adv[1, 0], adv[1, 1]]
    assert [g.item() for g in got] == pytest.approx(_whiten(valid))
    assert adv[0, 3].item() == 0.0 and adv[1, 2:].abs().sum().item() == 0.0
    with pytest.raises(ValueError, match="gamma"):
        ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={})


def test_remax_uses_greedy_baseline_per_prompt() -> None:
    rewards, mask = outcome([1.0, 0.0, 1.0], length=3, lengths=[3, 2, 1])
    baselines = ca.expand_remax_baselines(
        torch.tensor([0.4, 1.0], dtype=F64), greedy_index=["p1", "p2"], index=["p1", "p1", "p2"]
    )
    assert baselines.tolist() == [0.4, 0.4, 1.0]
    adv, returns = ca.compute_remax_outcome_advantage(rewards, baselines, mask)
    assert returns.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert adv[0].tolist() == pytest.approx([0.6, 0.6, 0.6])
    assert adv[1].tolist() == pytest.approx([-0.4, -0.4, 0.0])
    assert adv[2].tolist() == pytest.approx([0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="no greedy baseline"):
        ca.expand_remax_baselines(torch.tensor([0.4]), ["p1"], ["p1", "p9"])
    with pytest.raises(ValueError, match=r"reward_baselines must be \[batch\]"):
        ca.compute_remax_outcome_advantage(rewards, baselines[:2], mask)


def test_opo_length_weighted_baseline() -> None:
    rewards, mask = outcome([1.0, 0.0], length=3, lengths=[1, 3])
    adv, _ = ca.compute_opo_outcome_advantage(rewards, mask, ["a", "a"])
    # baseline (1*1 + 3*0) / 4
    assert adv[0, 0].item() == pytest.approx(0.75) and adv[1, 0].item() == pytest.approx(-0.25)


def test_gae_worked_example_with_observation_token() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.6, 0.7]], dtype=F64)
    mask = torch.ones(1, 3, dtype=F64)
    adv, returns = ca.compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # deltas 0.1, 0.1, 0.3 -> raw advantages 0.5, 0.4, 0.3; returns = raw + values = 1
    assert returns.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])
    assert adv.tolist()[0] == pytest.approx(_whiten([0.5, 0.4, 0.3]), abs=1e-6)
    # the middle token is a tool observation (mask 0): it is skipped by the recursion
    obs_mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=F64)
    rewards2 = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]], dtype=F64)
    values2 = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.1, 0.0]], dtype=F64)
    mask2 = torch.cat([obs_mask, torch.tensor([[1.0, 1.0, 0.0]], dtype=F64)])
    _, returns2 = ca.compute_gae_advantage_return(rewards2, values2, mask2, gamma=1.0, lam=1.0)
    # row 0: A2 = 0.3; A1 carries 0.3 (masked); A0 = (0 + 0.7 - 0.5) + 0.3 = 0.5
    assert returns2[0].tolist() == pytest.approx([0.5 + 0.5, 0.3 + 0.6, 0.3 + 0.7])


def test_gpg_scales_by_nonzero_fraction() -> None:
    rewards, mask = outcome([1.0, 0.0, 0.0, 0.0])
    adv, _ = ca.compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "b", "b"])
    # alpha = 4 / 1 nonzero score; group a centred: [0.5, -0.5]
    assert per_seq(adv) == pytest.approx([2.0, -2.0, 0.0, 0.0])


# --- registry and dispatch --------------------------------------------------------------


def test_builtin_estimators_are_registered_by_name_and_enum() -> None:
    for member in ca.AdvantageEstimator:
        assert ca.get_adv_estimator_fn(member) is ca.get_adv_estimator_fn(member.value)
    assert ca.get_adv_estimator_fn("grpo") is ca.compute_grpo_outcome_advantage
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GAE) is ca.compute_gae_advantage_return
    with pytest.raises(ValueError, match="Unknown advantage estimator"):
        ca.get_adv_estimator_fn("no_such_estimator")


@pytest.fixture
def custom_estimator_name():
    name = "test_median_baseline"
    yield name
    ca.ADV_ESTIMATOR_REGISTRY.pop(name, None)


def test_user_estimator_plugs_into_compute_advantage(custom_estimator_name: str) -> None:
    calls: list[dict] = []

    @ca.register_adv_est(custom_estimator_name)
    def median_baseline(token_level_rewards, response_mask, index, config=None, **kwargs):
        calls.append({"index": list(index), "config": config, "extra": sorted(kwargs)})
        scores = token_level_rewards.sum(-1)
        adv = (scores - scores.median()).unsqueeze(-1) * response_mask
        return adv, adv

    assert ca.get_adv_estimator_fn(custom_estimator_name) is median_baseline
    # registering the same function again is allowed; a different one is not
    ca.register_adv_est(custom_estimator_name)(median_baseline)
    with pytest.raises(ValueError, match="already been registered"):
        ca.register_adv_est(custom_estimator_name)(lambda **kw: None)

    rewards, mask = outcome([3.0, 1.0, 2.0], length=2)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(["u", "u", "v"], dtype=object)},
    )
    cfg = {"gamma": 1.0}
    ca.compute_advantage(data, custom_estimator_name, config=cfg)
    assert calls == [{"index": ["u", "u", "v"], "config": cfg, "extra": []}]
    assert data.batch["advantages"][:, 0].tolist() == [1.0, -1.0, 0.0]
    assert torch.equal(data.batch["returns"], data.batch["advantages"])


def test_compute_advantage_dispatches_grpo_and_gae() -> None:
    rewards, mask = outcome([1, 0, 1, 1, 0, 0], length=3)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(list("aaabbb"), dtype=object)},
    )
    ca.compute_advantage(data, ca.AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=False)
    assert data.batch["advantages"][:, 0].tolist() == pytest.approx([1 / 3, -2 / 3, 1 / 3, 2 / 3, -1 / 3, -1 / 3])
    with pytest.raises(ValueError, match="values"):
        ca.compute_advantage(data, "gae")
    data.batch["values"] = torch.zeros_like(rewards)
    ca.compute_advantage(data, "gae", gamma=1.0, lam=1.0)
    assert data.batch["returns"][:, 0].tolist() == pytest.approx([1, 0, 1, 1, 0, 0])
    no_uid = DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask})
    with pytest.raises(ValueError, match="uid"):
        ca.compute_advantage(no_uid, "grpo")


def test_gdpo_normalises_each_reward_component_through_compute_advantage() -> None:
    rewards, mask = outcome([0.0] * 4, length=3, lengths=[3, 2, 3, 1])
    prompts = torch.zeros(4, 2, dtype=torch.long)
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "prompts": prompts,
            "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], dim=1),
        },
        non_tensors={
            "uid": np.array(["a", "a", "b", "b"], dtype=object),
            "fmt": np.array([1.0, 0.0, 1.0, 1.0]),
            "acc": np.array([0.0, 2.0, 1.0, 3.0]),
        },
    )
    cfg = {"gdpo_reward_keys": ["fmt", "acc"], "gdpo_reward_weights": [1.0, 0.5]}
    ca.compute_advantage(data, "gdpo", config=cfg)
    # per component GRPO (groups of 2: +-1/sqrt(2)/(std+eps) -> +-0.7071), weighted sum, then whitened
    g = 1 / (math.sqrt(0.5) + 1e-6) * 0.5
    summed = [g - 0.5 * g, -g + 0.5 * g, 0.0 - 0.5 * g, 0.0 + 0.5 * g]
    valid = [v for v, n in zip(summed, [3, 2, 3, 1]) for _ in range(n)]
    assert data.batch["advantages"][mask.bool()].tolist() == pytest.approx(_whiten(valid), abs=1e-5)
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        ca.compute_advantage(data, "gdpo", config={})
    with pytest.raises(ValueError, match="'missing'"):
        ca.compute_advantage(data, "gdpo", config={"gdpo_reward_keys": ["missing"]})


def test_optimal_token_baseline_through_compute_advantage() -> None:
    rewards, mask = outcome([1.0, 0.0, 0.3], length=2)
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "old_log_probs": torch.full_like(rewards, math.log(0.5)),
        },
        non_tensors={"uid": np.array(["a", "a", "solo"], dtype=object)},
    )
    with pytest.raises(ValueError, match="sum_pi_squared"):
        ca.compute_advantage(data, "optimal_token_baseline")
    # w_t = 1 - 2 * 0.5 + 0.5 = 0.5 per step for everyone: the baseline is the plain
    # group mean of the return-to-go (0.5); a singleton keeps its return
    data.batch["sum_pi_squared"] = torch.full_like(rewards, 0.5)
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        ca.compute_advantage(data, name)
        expected = [0.5, 0.5, -0.5, -0.5, 0.3, 0.3]
        assert data.batch["advantages"].flatten().tolist() == pytest.approx(expected, abs=1e-7)
        assert data.batch["returns"][:, 0].tolist() == pytest.approx([1.0, 0.0, 0.3])
