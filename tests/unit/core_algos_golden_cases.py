"""Shared cases for the verl parity test of trainer_svc.core_algos.

``run_cases(impl, inputs)`` evaluates every algorithm on fixed inputs through an adapter
``impl`` and returns ``{case name: tensor}``. The golden file
``data/core_algos_verl_golden.json`` holds the outputs of verl 0.9.1's own
``core_algos`` on the same inputs (made by ``data/make_core_algos_golden.py`` with the
verl wheel from PyPI); ``test_core_algos_golden.py`` runs the cases through meshrl's
implementation and compares.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ESTIMATORS = [
    "grpo",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
    "grpo_passk",
]
KL_TYPES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+", "abs+", "k2+"]
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
CLIP_CONFIGS = {
    "sym": {"clip_ratio": 0.2},
    "asym": {"clip_ratio": 0.2, "clip_ratio_low": 0.1, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0},
}
POLICY_LOSSES = [
    "vanilla", "gspo", "gpg", "dppo_tv", "dppo_kl", "sapo", "cispo", "geo_mean", "dro", "clip_cov", "kl_cov",
]
#: ``config.policy_loss`` settings for the losses that read them (large shares, so the
#: covariance-based losses actually select tokens on these small inputs).
POLICY_LOSS_SETTINGS = {
    "clip_cov_ratio": 0.1,
    "clip_cov_lb": 0.05,
    "clip_cov_ub": 5.0,
    "kl_cov_ratio": 0.1,
    "ppo_kl_coef": 0.3,
    "dro_beta": 0.5,
}
#: ``config.policy_loss.rollout_correction`` settings of the bypass-mode cases.
BYPASS_SETTINGS = {
    "ppo_clip": {"loss_type": "ppo_clip", "rollout_is": "token", "rollout_is_threshold": 2.0},
    "reinforce_token": {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 2.0},
    "reinforce_seq_icepop": {"loss_type": "reinforce", "rollout_is": "sequence", "rollout_is_threshold": "0.5_3.0"},
    "reinforce_plain": {"loss_type": "reinforce", "rollout_is": None},
}
GLOBAL_BATCH = {"dp_size": 4, "batch_num_tokens": 100, "global_batch_size": 40, "loss_scale_factor": 13}


def make_inputs(seed: int = 1234, batch: int = 8, length: int = 6, vocab: int = 5) -> dict[str, Any]:
    """Deterministic inputs covering the edge cases: a fully masked row, a masked token inside
    a response, an all-equal group, a singleton group, a process reward and responses of
    different lengths."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    mask[3] = 0.0
    mask[5, 2] = 0.0  # a tool-observation token inside a response
    scores = torch.randint(0, 3, (batch,), generator=gen).float() * 0.5
    scores[0:2] = 1.0
    rewards = torch.zeros(batch, length)
    for i in range(batch):
        rewards[i, max(int(lengths[i]) - 1, 0)] = scores[i]
    rewards[5, 0] += 0.25

    def noise(scale: float, *shape: int) -> torch.Tensor:
        return torch.randn(*(shape or (batch, length)), generator=gen) * scale

    old = -torch.rand(batch, length, generator=gen) * 2
    values = noise(1.0)
    return {
        "rewards": rewards,
        "mask": mask,
        "index": np.array(["g0"] * 2 + ["g1"] * 3 + ["g2"] * 2 + ["solo"], dtype=object),
        "passk_index": np.array(["p1"] * 4 + ["p2"] * 4, dtype=object),
        "values": values,
        "old": old,
        "logp": old + noise(0.4),
        "ref": old + noise(0.3),
        "rollout": old + noise(0.5),
        "adv_tok": noise(1.0),
        "vpreds": values + noise(0.5),
        "returns": values + noise(1.0),
        "logits": noise(1.0, batch, length, vocab),
        "baselines": torch.rand(batch, generator=gen),
        "loss_mat": noise(1.0),
        "fmt_reward": torch.randint(0, 2, (batch,), generator=gen).float(),
        "acc_reward": torch.rand(batch, generator=gen) * 2,
    }


def inputs_to_json(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in inputs.items()}


def inputs_from_json(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        out[key] = np.array(value, dtype=object) if key.endswith("index") else torch.tensor(value, dtype=torch.float32)
    return out


def run_cases(impl: Any, x: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every case through ``impl``; see the adapters in the golden test and generator."""
    out: dict[str, torch.Tensor] = {}

    def put(name: str, value: Any) -> None:
        out[name] = torch.as_tensor(value, dtype=torch.float64).detach()

    rewards, mask = x["rewards"], x["mask"]
    for est in ESTIMATORS:
        for norm in (True, False):
            index = x["passk_index"] if est == "grpo_passk" else x["index"]
            adv, ret = impl.advantage(est, rewards.clone(), mask, index, norm, gamma=0.9)
            put(f"adv/{est}/norm={norm}/advantages", adv)
            put(f"adv/{est}/norm={norm}/returns", ret)
    prompts = torch.zeros(rewards.shape[0], 3, dtype=torch.long)
    gdpo_batch = {"prompts": prompts, "attention_mask": torch.cat([torch.ones_like(prompts), mask.long()], dim=1)}
    gdpo_columns = {"fmt": x["fmt_reward"].numpy(), "acc": x["acc_reward"].numpy()}
    gdpo_cfg = {"gdpo_reward_keys": ["fmt", "acc"], "gdpo_reward_weights": [1.0, 0.5]}
    for norm in (True, False):
        adv, _ = impl.gdpo(rewards.clone(), mask, x["index"], norm, gdpo_cfg, gdpo_columns, gdpo_batch)
        put(f"adv/gdpo/components/norm={norm}", adv)
        adv, _ = impl.gdpo(rewards.clone(), mask, x["index"], norm, None, None, None)
        put(f"adv/gdpo/fallback/norm={norm}", adv)
    sum_pi_sq = (torch.softmax(x["logits"], dim=-1) ** 2).sum(dim=-1)
    otb_weights = impl.is_weights(x["old"] - x["rollout"], mask, "token", 2.0, False)
    for est in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        for tail in (True, False):
            for weights_name, weights in (("none", None), ("tis", otb_weights)):
                adv, ret = impl.otb(est, rewards, mask, x["index"], x["old"], sum_pi_sq, weights, tail)
                put(f"adv/{est}/tail={tail}/w={weights_name}/advantages", adv)
                put(f"adv/{est}/tail={tail}/w={weights_name}/returns", ret)
    adv, ret = impl.gae(rewards, x["values"], mask, 0.9, 0.8)
    put("adv/gae/advantages", adv)
    put("adv/gae/returns", ret)
    adv, ret = impl.reinforce_plus_plus(rewards, mask, 0.9)
    put("adv/reinforce_plus_plus/advantages", adv)
    put("adv/reinforce_plus_plus/returns", ret)
    adv, ret = impl.remax(rewards, x["baselines"], mask)
    put("adv/remax/advantages", adv)
    put("adv/remax/returns", ret)

    for kind in KL_TYPES:
        logp = x["logp"].clone().requires_grad_(True)
        value = impl.kl_penalty(logp, x["ref"], kind)
        (value * mask).sum().backward()
        put(f"kl/{kind}/value", value)
        put(f"kl/{kind}/grad", logp.grad)

    for mode in AGG_MODES:
        put(f"agg/{mode}", impl.agg_loss(x["loss_mat"], mask, mode))
        put(f"agg/{mode}/global", impl.agg_loss(x["loss_mat"], mask, mode, **GLOBAL_BATCH))

    tis = impl.is_weights(x["old"] - x["rollout"], mask, "token", 2.0, False)
    put("is/tis_token", tis)
    for clip_name, clip_cfg in CLIP_CONFIGS.items():
        for loss_name in POLICY_LOSSES:
            for weights_name, weights in (("none", None), ("tis", tis)):
                for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
                    logp = x["logp"].clone().requires_grad_(True)
                    torch.manual_seed(7)  # clip_cov draws from the global RNG
                    loss, metrics = impl.policy_loss(
                        loss_name, x["old"], logp, x["adv_tok"], mask, mode, clip_cfg, weights
                    )
                    loss.backward()
                    tag = f"pl/{loss_name}/{clip_name}/{mode}/w={weights_name}"
                    put(tag + "/loss", loss)
                    put(tag + "/grad", logp.grad)
                    for key in sorted(metrics):
                        put(f"{tag}/{key}", metrics[key])

    for bypass_name, corr in BYPASS_SETTINGS.items():
        for mode in ("token-mean", "seq-mean-token-sum"):
            logp = x["logp"].clone().requires_grad_(True)
            loss, metrics = impl.bypass(x["rollout"], logp, x["adv_tok"], mask, mode, corr)
            loss.backward()
            tag = f"bypass/{bypass_name}/{mode}"
            put(tag + "/loss", loss)
            put(tag + "/grad", logp.grad)
            for key in ("actor/ppo_kl", "actor/pg_clipfrac"):
                if key in metrics:
                    put(f"{tag}/{key}", metrics[key])

    legacy = impl.legacy_policy_loss(x["old"], x["logp"], x["adv_tok"], mask)
    for i, name in enumerate(("loss", "clipfrac", "ppo_kl", "clipfrac_lower")):
        put(f"legacy/{name}", legacy[i])
    for mode in ("token-mean", "seq-mean-token-sum"):
        vf_loss, vf_clipfrac = impl.value_loss(x["vpreds"], x["returns"], x["values"], mask, 0.5, mode)
        put(f"value/{mode}/loss", vf_loss)
        put(f"value/{mode}/clipfrac", vf_clipfrac)
    put("entropy", impl.entropy_loss(x["logits"], mask))
    put("rewards", impl.compute_rewards(rewards, x["old"], x["ref"], 0.05))
    for level in ("token", "sequence"):
        for normalize in (False, True):
            put(f"is/{level}/bn={normalize}", impl.is_weights(x["old"] - x["rollout"], mask, level, 3.0, normalize))
        put(f"is/{level}/icepop", impl.is_weights(x["old"] - x["rollout"], mask, level, "0.6_2.5", False))
    put("kl_ctrl/adaptive", impl.adaptive_kl([0.2, 0.01, 0.06, 0.04], 64))
    return out


def compare(got: dict[str, torch.Tensor], want: dict[str, Any], atol: float) -> list[str]:
    """Names of cases that are missing on either side or differ by more than ``atol``."""
    bad = sorted(set(got) ^ set(want))
    for name in sorted(set(got) & set(want)):
        expected = torch.as_tensor(want[name], dtype=torch.float64)
        if got[name].shape != expected.shape or not torch.allclose(got[name], expected, atol=atol, rtol=0.0):
            bad.append(name)
    return bad

