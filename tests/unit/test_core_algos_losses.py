"""kl_penalty, agg_loss, policy/value/entropy losses and KL controllers on hand-computed numbers."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest
import torch

from services.protocol import DataProto
from trainer_svc import core_algos as ca

F64 = torch.float64
LOG2 = math.log(2.0)


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# --- kl_penalty -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "pos", "neg"),
    [
        # d = logp - ref = +log 2 (pos) or -log 2 (neg)
        ("kl", LOG2, -LOG2),
        ("k1", LOG2, -LOG2),
        ("abs", LOG2, LOG2),
        ("mse", 0.5 * LOG2**2, 0.5 * LOG2**2),
        ("k2", 0.5 * LOG2**2, 0.5 * LOG2**2),
        # k3 = exp(ref - logp) - (ref - logp) - 1
        ("low_var_kl", 0.5 + LOG2 - 1, 2 - LOG2 - 1),
        ("k3", 0.5 + LOG2 - 1, 2 - LOG2 - 1),
    ],
)
def test_kl_penalty_types_on_known_numbers(kind: str, pos: float, neg: float) -> None:
    logp = t([math.log(0.5), math.log(0.25)])
    ref = t([math.log(0.25), math.log(0.5)])
    assert ca.kl_penalty(logp, ref, kind).tolist() == pytest.approx([pos, neg], abs=1e-12)


def test_low_var_kl_is_clamped() -> None:
    out = ca.kl_penalty(t([-30.0, 0.0]), t([0.0, -30.0]), "low_var_kl")
    # ref - logp = 30 is clamped to 20: exp(20) - 21 > 10 -> clamped to 10
    assert out[0].item() == 10.0
    # ref - logp = -30 -> -20: exp(-20) + 19 -> clamped to 10
    assert out[1].item() == 10.0


@pytest.mark.parametrize("kind", ["k1+", "kl+", "k3+", "low_var_kl+", "abs+", "k2+", "mse+"])
def test_straight_through_variants_keep_value_and_take_k2_gradient(kind: str) -> None:
    logp = t([math.log(0.5), math.log(0.25), -1.0]).requires_grad_(True)
    ref = t([math.log(0.25), math.log(0.5), -1.3])
    value = ca.kl_penalty(logp, ref, kind)
    base = ca.kl_penalty(logp.detach(), ref, kind[:-1])
    assert value.detach().tolist() == pytest.approx(base.tolist(), abs=1e-12)
    value.sum().backward()
    # gradient of 0.5 * (logp - ref)^2 is (logp - ref)
    assert logp.grad.tolist() == pytest.approx((logp.detach() - ref).tolist(), abs=1e-12)


def test_plain_k3_gradient_differs_from_straight_through() -> None:
    logp = t([math.log(0.5)]).requires_grad_(True)
    ref = t([math.log(0.25)])
    ca.kl_penalty(logp, ref, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) + logp - ref - 1] = 1 - exp(ref - logp) = 0.5
    assert logp.grad.item() == pytest.approx(0.5)


def test_full_and_unknown_kl_types_raise_clear_errors() -> None:
    x = t([0.0])
    with pytest.raises(NotImplementedError, match="full"):
        ca.kl_penalty(x, x, "full")
    with pytest.raises(NotImplementedError, match="full"):
        ca.kl_penalty(x, x, "full+")
    with pytest.raises(ValueError, match="unknown kl_penalty 'k4'"):
        ca.kl_penalty(x, x, "k4")
    with pytest.raises(NotImplementedError):  # verl raises NotImplementedError here
        ca.kl_penalty(x, x, "k4")


# --- agg_loss ---------------------------------------------------------------------------

LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = t([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the last row is fully masked


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),
        ("token-sum", 1 + 2 + 4),
        # sequence sums 3 and 4 over the two sequences with a valid token
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        # Dr.GRPO: seq-mean-token-sum / horizon (T = 3)
        ("seq-mean-token-sum-norm", (3 + 4) / 2 / 3),
    ],
)
def test_agg_loss_modes_on_small_matrix(mode: str, expected: float) -> None:
    assert ca.agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-7)


def test_agg_loss_constant_scale_factor_and_bool_mask() -> None:
    out = ca.agg_loss(LOSS, MASK.bool(), "seq-mean-token-sum-norm", loss_scale_factor=7)
    assert out.item() == pytest.approx(3.5 / 7)
    # masked positions holding NaN do not leak into the result
    nan_loss = LOSS.clone()
    nan_loss[2, :] = float("nan")
    nan_loss[0, 2] = float("inf")
    for mode in ca.AGG_LOSS_MODES:
        assert torch.isfinite(ca.agg_loss(nan_loss, MASK, mode))


@pytest.mark.parametrize("mode", ca.AGG_LOSS_MODES)
def test_agg_loss_global_batch_info_makes_dp_split_invariant(mode: str) -> None:
    gen = torch.Generator().manual_seed(1)
    loss = torch.rand(6, 5, generator=gen, dtype=F64)
    mask = (torch.rand(6, 5, generator=gen) > 0.4).to(F64)
    mask[5] = 0
    whole = ca.agg_loss(loss, mask, mode)
    kwargs = {
        "dp_size": 2,
        "batch_num_tokens": mask.sum(),
        "global_batch_size": (mask.sum(-1) > 0).sum(),
    }
    # two ranks, each with two micro-batches: FSDP averages ranks, micro-batches are summed
    per_rank = []
    for rank_rows in (slice(0, 3), slice(3, 6)):
        rank_loss, rank_mask = loss[rank_rows], mask[rank_rows]
        micro = [ca.agg_loss(rank_loss[i : i + 2], rank_mask[i : i + 2], mode, **kwargs) for i in (0, 2)]
        per_rank.append(sum(micro))
    assert (sum(per_rank) / 2).item() == pytest.approx(whole.item(), abs=1e-12)


def test_agg_loss_all_masked_is_zero_not_nan_and_keeps_graph() -> None:
    loss = t([[1.0, 2.0]]).requires_grad_(True)
    mask = torch.zeros(1, 2, dtype=F64)
    for mode in ca.AGG_LOSS_MODES:
        out = ca.agg_loss(loss, mask, mode)
        assert out.item() == 0.0
        out.backward()
        assert torch.isfinite(loss.grad).all()


def test_agg_loss_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="invalid loss_agg_mode"):
        ca.agg_loss(LOSS, MASK, "token-average")
    with pytest.raises(ValueError, match="batch_num_tokens"):
        ca.agg_loss(LOSS, MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        ca.agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2)
    with pytest.raises(ValueError, match="differ"):
        ca.agg_loss(LOSS, MASK[:, :2], "token-mean")


# --- policy losses ----------------------------------------------------------------------


@dataclasses.dataclass
class ActorCfg:
    clip_ratio: float = 0.2
    clip_ratio_low: Optional[float] = None
    clip_ratio_high: Optional[float] = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    global_batch_info: dict = dataclasses.field(default_factory=dict)


RATIOS = [1.5, 0.9, 0.5, 1.1]
ADV = [1.0, 1.0, -1.0, -1.0]


def _inputs(ratios=RATIOS, adv=ADV):
    old = torch.zeros(1, len(ratios), dtype=F64)
    logp = torch.log(t([ratios])).requires_grad_(True)
    return old, logp, t([adv]), torch.ones(1, len(ratios), dtype=F64)


@pytest.mark.parametrize(
    "config", [ActorCfg(), {"clip_ratio": 0.2}, SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None)]
)
def test_vanilla_clipping_on_hand_built_case(config) -> None:
    old, logp, adv, mask = _inputs()
    fn = ca.get_policy_loss_fn("vanilla")
    loss, metrics = fn(old, logp, adv, mask, "token-mean", config)
    # token 0: r=1.5, A=+1 -> max(-1.5, -1.2) = -1.2 (clipped)
    # token 1: r=0.9, A=+1 -> -0.9 (inside the range)
    # token 2: r=0.5, A=-1 -> max(0.5, 0.8) = 0.8 (clipped; dual bound 3 not hit)
    # token 3: r=1.1, A=-1 -> 1.1
    assert loss.item() == pytest.approx((-1.2 - 0.9 + 0.8 + 1.1) / 4)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(r) for r in RATIOS) / 4)
    loss.backward()
    # clipped tokens carry no gradient; unclipped: d(-A r)/dlogp = -A r
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.9 / 4, 0.0, 1.1 / 4])


def test_vanilla_asymmetric_clip_and_dual_clip() -> None:
    old, logp, adv, mask = _inputs(ratios=[1.5, 0.7, 5.0], adv=[1.0, -1.0, -1.0])
    cfg = ActorCfg(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    loss, metrics = ca.compute_policy_loss_vanilla(old, logp, adv, mask, config=cfg)
    # token 0: upper bound 1.28 -> -1.28; token 1: r=0.7 < 0.8 -> 0.8 (clip); token 2: A<0,
    # r=5: max(5, 1.2) = 5, dual clip caps it at 3
    assert loss.item() == pytest.approx((-1.28 + 0.8 + 3.0) / 3)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0])


def test_vanilla_rollout_is_weights_and_global_batch_info() -> None:
    old, logp, adv, mask = _inputs()
    weights = t([[2.0, 1.0, 0.0, 1.0]])
    loss, _ = ca.compute_policy_loss_vanilla(old, logp, adv, mask, config=ActorCfg(), rollout_is_weights=weights)
    assert loss.item() == pytest.approx((-1.2 * 2 - 0.9 + 0 + 1.1) / 4)
    cfg = ActorCfg(global_batch_info={"dp_size": 2, "batch_num_tokens": 8})
    loss2, _ = ca.compute_policy_loss_vanilla(old, logp, adv, mask, config=cfg)
    assert loss2.item() == pytest.approx((-1.2 - 0.9 + 0.8 + 1.1) / 8 * 2)
    with pytest.raises(ValueError, match="unknown keys"):
        ca.compute_policy_loss_vanilla(old, logp, adv, mask, config=ActorCfg(global_batch_info={"dp": 2}))


def test_vanilla_rejects_bad_config_and_shapes() -> None:
    old, logp, adv, mask = _inputs()
    with pytest.raises(ValueError, match="actor config"):
        ca.compute_policy_loss_vanilla(old, logp, adv, mask)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss_vanilla(old, logp, adv, mask, config=ActorCfg(clip_ratio_c=1.0))
    with pytest.raises(ValueError, match="share one"):
        ca.compute_policy_loss_vanilla(old, logp, adv[:, :2], mask, config=ActorCfg())


def test_legacy_compute_policy_loss_matches_vanilla() -> None:
    old, logp, adv, mask = _inputs(ratios=[1.5, 0.7, 5.0], adv=[1.0, -1.0, -1.0])
    with pytest.warns(DeprecationWarning):
        loss, clipfrac, ppo_kl, clipfrac_lower = ca.compute_policy_loss(
            old, logp, adv, mask, cliprange=0.2, cliprange_high=0.28, clip_ratio_c=3.0
        )
    new_loss, metrics = ca.compute_policy_loss_vanilla(
        old, logp, adv, mask, config={"clip_ratio": 0.2, "clip_ratio_high": 0.28}
    )
    assert loss.item() == pytest.approx(new_loss.item())
    assert clipfrac.item() == pytest.approx(metrics["actor/pg_clipfrac"])
    assert ppo_kl.item() == pytest.approx(metrics["actor/ppo_kl"])
    assert clipfrac_lower.item() == pytest.approx(metrics["actor/pg_clipfrac_lower"])


def test_gspo_and_gpg_losses() -> None:
    old = torch.zeros(2, 2, dtype=F64)
    logp = t([[math.log(2.0), 0.0], [0.0, 0.0]]).requires_grad_(True)
    adv = t([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2, dtype=F64)
    loss, metrics = ca.get_policy_loss_fn("gspo")(old, logp, adv, mask, config=ActorCfg(clip_ratio=0.2))
    # sequence ratio of row 0 is exp(log2 / 2) = sqrt 2 > 1.2 -> clipped to 1.2; row 1 ratio 1
    assert loss.item() == pytest.approx((-1.2 + 1.0) / 2)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    loss_gpg, metrics_gpg = ca.get_policy_loss_fn("gpg")(old, logp, adv, mask, config=ActorCfg())
    assert loss_gpg.item() == pytest.approx(-math.log(2.0) / 4) and metrics_gpg == {}


@pytest.fixture
def custom_loss_name():
    yield "test_reinforce"
    ca.POLICY_LOSS_REGISTRY.pop("test_reinforce", None)


def test_user_policy_loss_registry_round_trip(custom_loss_name: str) -> None:
    @ca.register_policy_loss(custom_loss_name)
    def reinforce(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
        rollout_is_weights=None,
    ):
        return ca.agg_loss(-log_prob * advantages, response_mask, loss_agg_mode), {"custom": 1.0}

    fn = ca.get_policy_loss_fn(custom_loss_name)
    assert fn is reinforce
    old, logp, adv, mask = _inputs()
    loss, metrics = fn(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
        loss_agg_mode="token-mean", config=ActorCfg(), rollout_is_weights=None,
    )
    assert metrics == {"custom": 1.0} and torch.isfinite(loss)
    with pytest.raises(ValueError, match="Unsupported loss mode: nope"):
        ca.get_policy_loss_fn("nope")


# --- value and entropy losses ---------------------------------------------------------


def test_value_loss_clipping() -> None:
    vpreds = t([[1.5, 1.1, 9.0]]).requires_grad_(True)
    values = t([[1.0, 1.0, 0.0]])
    returns = t([[2.0, 1.0, 0.0]])
    mask = t([[1, 1, 0]])
    loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: (1.5-2)^2 = 0.25 vs (1.2-2)^2 = 0.64 -> 0.64 (clipped); token 1: 0.01 both
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.01) / 2)
    assert clipfrac.item() == pytest.approx(0.5)
    loss.backward()
    assert vpreds.grad[0].tolist() == pytest.approx([0.0, 0.5 * 2 * 0.1 / 2, 0.0])


def test_entropy_loss() -> None:
    logits = torch.zeros(1, 2, 4, dtype=F64)
    logits[0, 1] = t([100.0, 0.0, 0.0, 0.0])
    mask = t([[1, 1]])
    ent = ca.compute_entropy_loss(logits, mask)
    # uniform over 4 -> log 4; near-one-hot -> ~0
    assert ent.item() == pytest.approx(math.log(4) / 2, abs=1e-9)
    assert ca.compute_entropy_loss(logits, t([[0, 1]])).item() == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="vocab"):
        ca.compute_entropy_loss(logits[0], mask)


# --- KL in reward ----------------------------------------------------------------------


def test_kl_controllers() -> None:
    fixed = ca.get_kl_controller({"type": "fixed", "kl_coef": 0.05})
    fixed.update(current_kl=10.0, n_steps=100)
    assert isinstance(fixed, ca.FixedKLController) and fixed.value == 0.05
    adaptive = ca.get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, target_kl=0.05, horizon=100))
    adaptive.update(current_kl=0.1, n_steps=10)  # error clipped to +0.2 -> x(1 + 0.2 * 10 / 100)
    assert adaptive.value == pytest.approx(0.102)
    adaptive.update(current_kl=0.045, n_steps=10)  # error -0.1 -> x(1 - 0.01)
    assert adaptive.value == pytest.approx(0.102 * 0.99)
    with pytest.raises(NotImplementedError, match="kl_ctrl.type"):
        ca.get_kl_controller({"type": "pid"})
    with pytest.raises(ValueError, match="horizon"):
        ca.get_kl_controller({"type": "adaptive", "horizon": 0})


def test_compute_rewards_and_apply_kl_penalty() -> None:
    scores = t([[0.0, 1.0], [0.0, 0.0]])
    old = t([[math.log(0.5), math.log(0.5)], [0.0, 0.0]])
    ref = t([[math.log(0.25), math.log(0.5)], [0.0, 0.0]])
    expected = [-0.1 * LOG2, 1.0, 0.0, 0.0]
    assert ca.compute_rewards(scores, old, ref, kl_ratio=0.1).flatten().tolist() == pytest.approx(expected)
    data = DataProto.from_dict(
        tensors={
            "token_level_scores": scores,
            "old_log_probs": old,
            "ref_log_prob": ref,
            "response_mask": t([[1, 1], [1, 0]]),
        }
    )
    ctrl = ca.FixedKLController(0.1)
    data, metrics = ca.apply_kl_penalty(data, ctrl, kl_penalty="kl")
    assert data.batch["token_level_rewards"].flatten().tolist() == pytest.approx(expected)
    # per-sequence mean KL: log2 / 2 and 0 -> batch mean log2 / 4
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(LOG2 / 4, rel=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1


def test_extra_losses_hand_cases_and_errors() -> None:
    old, logp, adv, mask = _inputs()
    # CISPO: every token keeps its gradient, weighted by the clipped ratio
    loss, metrics = ca.get_policy_loss_fn("cispo")(old, logp, adv, mask, config={"clip_ratio": 0.2})
    clipped = [1.2, 0.9, 0.8, 1.1]
    logs = [math.log(r) for r in RATIOS]
    assert loss.item() == pytest.approx(-sum(c * a * lg for c, a, lg in zip(clipped, ADV, logs)) / 4)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-c * a / 4 for c, a in zip(clipped, ADV)])
    # DRO: -(log_prob * A - beta / 2 * (log_prob - old)^2)
    dro, _ = ca.get_policy_loss_fn("dro")(old, logp.detach(), adv, mask, config={"policy_loss": {"dro_beta": 0.5}})
    assert dro.item() == pytest.approx(-sum(lg * a - 0.25 * lg * lg for lg, a in zip(logs, ADV)) / 4)
    with pytest.raises(ValueError, match="dro_beta"):
        ca.get_policy_loss_fn("dro")(old, logp, adv, mask, config={})
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        ca.get_policy_loss_fn("kl_cov")(old, logp, adv, mask, config={"policy_loss": {"kl_cov_ratio": -1}})


def test_pf_ppo_resamples_rows_by_score() -> None:
    scores = t([[0.0, 0.0], [0.0, 1.0], [0.0, 0.5], [0.5, 0.0]])
    data = DataProto.from_dict(
        tensors={"token_level_scores": scores, "row": torch.arange(4)},
        non_tensors={"uid": np.array(list("abcd"), dtype=object)},
        meta_info={"per_row": [10, 11, 12, 13], "temperature": 1.0},
    )
    torch.manual_seed(0)
    out = ca.compute_pf_ppo_reweight_data(data, "max_min")
    rows = out.batch["row"].tolist()
    assert len(rows) == 4 and set(rows) <= {0, 1}  # only the best and worst rows carry weight
    assert out.non_tensor_batch["uid"].tolist() == ["abcd"[r] for r in rows]
    assert out.meta_info == {"per_row": [10 + r for r in rows], "temperature": 1.0}
    only_best = ca.compute_pf_ppo_reweight_data(data, "pow", weight_pow=2.0)
    assert set(only_best.batch["row"].tolist()) <= {1, 2, 3}  # |score| ** 2: row 0 has weight ~0
    with pytest.raises(ValueError, match="reweight_method"):
        ca.compute_pf_ppo_reweight_data(data, "softmax")
