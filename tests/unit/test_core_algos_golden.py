"""Parity with verl: every algorithm of trainer_svc.core_algos reproduces the outputs that
verl 0.9.1's own core_algos produced on the same inputs (values, gradients and metrics;
see core_algos_golden_cases.py and data/make_core_algos_golden.py)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from tests.unit.core_algos_golden_cases import POLICY_LOSS_SETTINGS, compare, inputs_from_json, make_inputs, run_cases
from trainer_svc import core_algos as M

GOLDEN = Path(__file__).with_name("data") / "core_algos_verl_golden.json"


class MeshrlImpl:
    """meshrl's functions, called with plain dict configs."""

    def advantage(self, est, rewards, mask, index, norm, gamma):
        fn = M.get_adv_estimator_fn(est)
        if est in ("grpo", "grpo_vectorized"):
            return fn(token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm)
        return fn(token_level_rewards=rewards, response_mask=mask, index=index,
                  config={"norm_adv_by_std_in_grpo": norm, "gamma": gamma})

    def gdpo(self, rewards, mask, index, norm, cfg, columns, batch):
        return M.compute_gdpo_outcome_advantage(
            rewards, mask, index, norm_adv_by_std_in_grpo=norm, config=cfg, non_tensor_batch=columns, batch=batch
        )

    def otb(self, est, rewards, mask, index, old, sum_pi_sq, weights, tail):
        return M.get_adv_estimator_fn(est)(
            token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=old,
            sum_pi_squared=sum_pi_sq, rollout_is_weights=weights, handle_zero_tail=tail,
        )

    def gae(self, rewards, values, mask, gamma, lam):
        return M.compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)

    def reinforce_plus_plus(self, rewards, mask, gamma):
        return M.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={"gamma": gamma})

    def remax(self, rewards, baselines, mask):
        return M.compute_remax_outcome_advantage(rewards, baselines, mask)

    def kl_penalty(self, logp, ref, kind):
        return M.kl_penalty(logp, ref, kind)

    def agg_loss(self, loss_mat, mask, mode, **kwargs):
        return M.agg_loss(loss_mat, mask, mode, **kwargs)

    def is_weights(self, log_ratio, mask, level, threshold, normalize):
        return M.compute_rollout_correction_weights(log_ratio, mask, level, threshold, normalize)[0]

    def policy_loss(self, name, old, logp, adv, mask, mode, clip_cfg, weights):
        cfg = {**clip_cfg, "policy_loss": dict(POLICY_LOSS_SETTINGS)}
        return M.get_policy_loss_fn(name)(old, logp, adv, mask, mode, cfg, weights)

    def bypass(self, rollout, logp, adv, mask, mode, corr):
        cfg = {"clip_ratio": 0.2, "policy_loss": {"rollout_correction": dict(corr)}}
        return M.get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, mode, cfg, None)

    def legacy_policy_loss(self, old, logp, adv, mask):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return M.compute_policy_loss(old, logp, adv, mask, cliprange=0.2, cliprange_high=0.3, clip_ratio_c=2.5,
                                         loss_agg_mode="seq-mean-token-mean")

    def value_loss(self, vpreds, returns, values, mask, clip, mode):
        return M.compute_value_loss(vpreds, returns, values, mask, clip, mode)

    def entropy_loss(self, logits, mask):
        return M.compute_entropy_loss(logits, mask)

    def compute_rewards(self, scores, old, ref, coef):
        return M.compute_rewards(scores, old, ref, coef)

    def adaptive_kl(self, kls, n_steps):
        ctrl = M.AdaptiveKLController(0.1, 0.05, 1000)
        for kl in kls:
            ctrl.update(kl, n_steps)
        return ctrl.value


@pytest.fixture(scope="module")
def golden() -> dict:
    raw = json.loads(GOLDEN.read_text())
    outputs = {
        name: torch.tensor(value, dtype=torch.float64).reshape(raw["shapes"][name])
        for name, value in raw["outputs"].items()
    }
    return {"inputs": inputs_from_json(raw["inputs"]), "outputs": outputs}


def test_golden_inputs_are_the_ones_the_cases_generate(golden: dict) -> None:
    fresh = make_inputs()
    for key, value in golden["inputs"].items():
        if key.endswith("index"):
            assert list(value) == list(fresh[key])
        else:
            assert torch.equal(value, fresh[key].to(value.dtype)), key


def test_meshrl_matches_verl_on_every_case(golden: dict) -> None:
    got = run_cases(MeshrlImpl(), golden["inputs"])
    assert len(got) >= 200
    bad = compare(got, golden["outputs"], atol=2e-6)
    assert bad == [], f"{len(bad)} cases differ from verl: {bad[:10]}"


def test_off_policy_tis_mode_equals_verl_truncated_is(golden: dict) -> None:
    x = golden["inputs"]
    weights, _ = M.compute_off_policy_weights(x["old"], x["rollout"], x["mask"], mode="tis", cap=2.0)
    assert torch.allclose(weights.double(), golden["outputs"]["is/tis_token"], atol=2e-6, rtol=0.0)


def test_golden_comparison_detects_a_wrong_algorithm(golden: dict) -> None:
    """The parity check can fail: a GRPO with the population std (a common simplification,
    used by the seeds' example) is caught."""

    class PopulationStd(MeshrlImpl):
        def advantage(self, est, rewards, mask, index, norm, gamma):
            adv, ret = super().advantage(est, rewards, mask, index, norm, gamma)
            if est == "grpo" and norm:
                adv = adv * (2.0 / 3.0) ** 0.5
            return adv, ret

    bad = compare(run_cases(PopulationStd(), golden["inputs"]), golden["outputs"], atol=2e-6)
    assert "adv/grpo/norm=True/advantages" in bad


def test_public_api_matches_verl_names_parameters_and_defaults() -> None:
    """Every public function of verl's core_algos exists here with the same parameter
    names, kinds and defaults; the estimator enum and both registries hold the same names."""
    import inspect

    api = json.loads(GOLDEN.read_text())["api"]
    problems = []
    for name, params in api["functions"].items():
        fn = getattr(M, name, None)
        if fn is None:
            problems.append(f"missing {name}")
            continue
        ours = [
            [param, None if p.default is inspect.Parameter.empty else repr(p.default), p.kind.name]
            for param, p in inspect.signature(fn).parameters.items()
        ]
        if ours != params:
            problems.append(f"{name}: {ours} != {params}")
    problems += [f"missing class {c}" for c in api["classes"] if not inspect.isclass(getattr(M, c, None))]
    assert problems == []
    assert [e.value for e in M.AdvantageEstimator] == api["adv_estimators"]
    assert set(api["adv_registry"]) <= set(M.ADV_ESTIMATOR_REGISTRY)
    assert set(api["policy_losses"]) <= set(M.POLICY_LOSS_REGISTRY)
