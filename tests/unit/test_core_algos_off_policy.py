"""Off-policy correction weights (none / truncated IS / decoupled PPO) and their use in the
policy loss."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_svc import core_algos as ca

F64 = torch.float64


def logs(probs) -> torch.Tensor:
    return torch.log(torch.tensor(probs, dtype=F64))


OLD = logs([[0.5, 0.5, 0.5], [0.4, 0.4, 0.4]])
ROLLOUT = logs([[0.1, 1.0, 0.5], [0.2, 0.4, 0.9]])  # token ratios old/rollout: 5, .5, 1 | 2, 1, .44
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=F64)


def test_none_mode_gives_no_weights() -> None:
    weights, metrics = ca.compute_off_policy_weights(OLD, None, MASK, mode="none")
    assert weights is None and metrics == {}


def test_tis_truncates_token_ratios_at_cap() -> None:
    weights, metrics = ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="tis", cap=2.0)
    assert weights[0].tolist() == pytest.approx([2.0, 0.5, 1.0])
    assert weights[1].tolist() == pytest.approx([2.0, 1.0, 0.0])  # masked token -> 0
    assert not weights.requires_grad
    assert metrics["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 5)
    assert metrics["rollout_is_max"] == pytest.approx(2.0)


def test_tis_sequence_level_uses_product_of_ratios() -> None:
    weights, _ = ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="tis", cap=10.0, level="sequence")
    assert weights[0].tolist() == pytest.approx([2.5, 2.5, 2.5])  # 5 * 0.5 * 1
    assert weights[1].tolist() == pytest.approx([2.0, 2.0, 0.0])  # 2 * 1 (last token masked)


def test_decoupled_drops_tokens_above_cap_instead_of_truncating() -> None:
    weights, metrics = ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="decoupled", cap=3.0)
    assert weights[0].tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert weights[1].tolist() == pytest.approx([2.0, 1.0, 0.0])
    assert metrics["rollout_is_dropped_fraction"] == pytest.approx(1 / 5)
    uncapped, _ = ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="decoupled", cap=None)
    assert uncapped[0].tolist() == pytest.approx([5.0, 0.5, 1.0])


def test_batch_normalize_rescales_to_unit_mean() -> None:
    log_ratio = OLD - ROLLOUT
    weights, metrics = ca.compute_rollout_correction_weights(
        log_ratio, MASK, "token", 2.0, rollout_is_batch_normalize=True
    )
    valid = weights[MASK.bool()]
    assert valid.mean().item() == pytest.approx(1.0)
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx((2 + 0.5 + 1 + 2 + 1) / 5)


def test_bad_off_policy_arguments_raise() -> None:
    with pytest.raises(ValueError, match="off-policy mode"):
        ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="vtrace")
    with pytest.raises(ValueError, match="needs rollout_log_probs"):
        ca.compute_off_policy_weights(OLD, None, MASK, mode="tis")
    with pytest.raises(ValueError, match="needs a cap"):
        ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="tis", cap=None)
    with pytest.raises(ValueError, match="differ"):
        ca.compute_off_policy_weights(OLD, ROLLOUT[:, :2], MASK, mode="tis")
    with pytest.raises(ValueError, match="'token' or 'sequence'"):
        ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="tis", level="geometric")


def test_tis_weights_enter_the_vanilla_policy_loss() -> None:
    """Decoupled PPO / TIS: the PPO ratio is taken against the recomputed old_log_probs
    and the behaviour correction multiplies each token's loss."""
    logp = (OLD + math.log(1.1)).clone().requires_grad_(True)  # ratio 1.1 everywhere, inside the clip range
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=F64)
    cfg = {"clip_ratio": 0.2}
    weights, _ = ca.compute_off_policy_weights(OLD, ROLLOUT, MASK, mode="tis", cap=2.0)
    loss, _ = ca.compute_policy_loss_vanilla(OLD, logp, adv, MASK, config=cfg, rollout_is_weights=weights)
    per_token = [-1.1 * 2.0, -1.1 * 0.5, -1.1 * 1.0, 1.1 * 2.0, 1.1 * 1.0]
    assert loss.item() == pytest.approx(sum(per_token) / 5)
    plain, _ = ca.compute_policy_loss_vanilla(OLD, logp, adv, MASK, config=cfg)
    assert plain.item() == pytest.approx((-1.1 * 3 + 1.1 * 2) / 5)


def test_icepop_band_zeroes_weights_outside_instead_of_truncating() -> None:
    log_ratio = OLD - ROLLOUT
    weights, _ = ca.compute_rollout_correction_weights(log_ratio, MASK, "token", "0.6_2.5")
    assert weights[0].tolist() == pytest.approx([0.0, 0.0, 1.0])  # 5 and 0.5 fall outside
    assert weights[1].tolist() == pytest.approx([2.0, 1.0, 0.0])
    assert ca.parse_rollout_is_threshold("0.5_2") == (2.0, 0.5)
    with pytest.raises(ValueError, match="lower bound"):
        ca.parse_rollout_is_threshold("3_2")
    with pytest.raises(TypeError):
        ca.parse_rollout_is_threshold(True)


def test_bypass_mode_uses_rollout_log_probs_as_anchor() -> None:
    logp = OLD.clone().requires_grad_(True)
    adv = torch.ones_like(OLD)
    reinforce = {"policy_loss": {"rollout_correction": {"loss_type": "reinforce", "rollout_is": "token"}}}
    loss, metrics = ca.get_policy_loss_fn("bypass_mode")(ROLLOUT, logp, adv, MASK, "token-mean", reinforce)
    # -w * log_prob * A with w = min(pi / pi_rollout, 2) on the five valid tokens
    w = [2.0, 0.5, 1.0, 2.0, 1.0]
    lp = [math.log(0.5)] * 3 + [math.log(0.4)] * 2
    assert loss.item() == pytest.approx(-sum(a * b for a, b in zip(w, lp)) / 5)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    clip = {"clip_ratio": 0.2, "policy_loss": {"rollout_correction": {"loss_type": "ppo_clip"}}}
    loss_clip, _ = ca.get_policy_loss_fn("bypass_mode")(ROLLOUT, logp, adv, MASK, "token-mean", clip)
    expected, _ = ca.compute_policy_loss_vanilla(ROLLOUT, logp, adv, MASK, config={"clip_ratio": 0.2})
    assert loss_clip.item() == pytest.approx(expected.item())
    with pytest.raises(ValueError, match="rollout_correction"):
        ca.get_policy_loss_fn("bypass_mode")(ROLLOUT, logp, adv, MASK, "token-mean", {"clip_ratio": 0.2})
    rs = {"policy_loss": {"rollout_correction": {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}}}
    with pytest.raises(NotImplementedError, match="rollout_rs"):
        ca.get_policy_loss_fn("bypass_mode")(ROLLOUT, logp, adv, MASK, "token-mean", rs)
