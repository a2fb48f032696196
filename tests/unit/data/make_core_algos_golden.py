"""Regenerate core_algos_verl_golden.json from verl's own core_algos (a developer tool, not a test).

Needs the verl wheel from PyPI unpacked on PYTHONPATH with omegaconf, codetiming and orjson
(``pip download verl==0.9.1 --no-deps``; ``pip install --target DIR omegaconf codetiming
orjson``). verl imports ray at package import although core_algos never uses it, so a
placeholder ``ray`` module is registered first. Run from the repository root:

    PYTHONPATH=.:<verl>:<deps> python tests/unit/data/make_core_algos_golden.py

(the repository root first: the verl wheel ships a top-level ``tests`` package too).
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path


class _Placeholder(types.ModuleType):
    """Stands in for ray during ``import verl`` only; core_algos never calls it."""

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        child = _Placeholder(f"{self.__name__}.{name}")
        sys.modules[child.__name__] = child
        return child

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else self


for _name in ("ray", "ray.util", "ray.actor", "ray.util.placement_group", "ray.util.scheduling_strategies",
              "ray.experimental", "ray.experimental.state", "ray.experimental.state.api", "ray._private"):
    sys.modules[_name] = _Placeholder(_name)

import verl  # noqa: E402
import verl.trainer.ppo.core_algos as V  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo import rollout_corr_helper as VR  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from verl.workers.config.actor import PolicyLossConfig  # noqa: E402

from tests.unit.core_algos_golden_cases import (  # noqa: E402
    POLICY_LOSS_SETTINGS,
    inputs_to_json,
    make_inputs,
    run_cases,
)


class VerlImpl:
    """Calls verl's functions the way verl's trainer and actor do."""

    def advantage(self, est, rewards, mask, index, norm, gamma):
        fn = V.get_adv_estimator_fn(est)
        if est in ("grpo", "grpo_vectorized"):
            return fn(token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm)
        cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": norm, "gamma": gamma})
        return fn(token_level_rewards=rewards, response_mask=mask, index=index, config=cfg)

    def gdpo(self, rewards, mask, index, norm, cfg, columns, batch):
        cfg = None if cfg is None else OmegaConf.create(cfg)
        return V.compute_gdpo_outcome_advantage(
            rewards, mask, index, norm_adv_by_std_in_grpo=norm, config=cfg, non_tensor_batch=columns, batch=batch
        )

    def otb(self, est, rewards, mask, index, old, sum_pi_sq, weights, tail):
        return V.get_adv_estimator_fn(est)(
            token_level_rewards=rewards, response_mask=mask, index=index, old_log_probs=old,
            sum_pi_squared=sum_pi_sq, rollout_is_weights=weights, handle_zero_tail=tail,
        )

    def gae(self, rewards, values, mask, gamma, lam):
        return V.compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)

    def reinforce_plus_plus(self, rewards, mask, gamma):
        return V.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=OmegaConf.create({"gamma": gamma}))

    def remax(self, rewards, baselines, mask):
        return V.compute_remax_outcome_advantage(rewards, baselines, mask)

    def kl_penalty(self, logp, ref, kind):
        return V.kl_penalty(logp, ref, kind)

    def agg_loss(self, loss_mat, mask, mode, **kwargs):
        return V.agg_loss(loss_mat, mask, mode, **kwargs)

    def is_weights(self, log_ratio, mask, level, threshold, normalize):
        return VR.compute_rollout_correction_weights(log_ratio, mask, level, threshold, normalize)[0]

    def policy_loss(self, name, old, logp, adv, mask, mode, clip_cfg, weights):
        if name in ("gspo", "sapo", "cispo"):  # these assert an ActorConfig
            cfg = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=1,
                              policy_loss=PolicyLossConfig(**POLICY_LOSS_SETTINGS),
                              **{k: v for k, v in clip_cfg.items() if k != "clip_ratio_c"})
        else:
            base = {"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None, "clip_ratio_c": 3.0,
                    "global_batch_info": {}, "policy_loss": dict(POLICY_LOSS_SETTINGS)}
            cfg = OmegaConf.create({**base, **clip_cfg})
        return V.get_policy_loss_fn(name)(old, logp, adv, mask, mode, cfg, weights)

    def bypass(self, rollout, logp, adv, mask, mode, corr):
        cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None,
                                "clip_ratio_c": 3.0, "global_batch_info": {},
                                "policy_loss": {"rollout_correction": dict(corr)}})
        return V.get_policy_loss_fn("bypass_mode")(rollout, logp, adv, mask, mode, cfg, None)

    def legacy_policy_loss(self, old, logp, adv, mask):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return V.compute_policy_loss(old, logp, adv, mask, cliprange=0.2, cliprange_high=0.3, clip_ratio_c=2.5,
                                         loss_agg_mode="seq-mean-token-mean")

    def value_loss(self, vpreds, returns, values, mask, clip, mode):
        return V.compute_value_loss(vpreds, returns, values, mask, clip, mode)

    def entropy_loss(self, logits, mask):
        return V.compute_entropy_loss(logits, mask)

    def compute_rewards(self, scores, old, ref, coef):
        return V.compute_rewards(scores, old, ref, coef)

    def adaptive_kl(self, kls, n_steps):
        ctrl = V.AdaptiveKLController(0.1, 0.05, 1000)
        for kl in kls:
            ctrl.update(kl, n_steps)
        return ctrl.value


def public_api() -> dict:
    """verl's public names: each function's parameters with their defaults, the
    estimator enum values, and the registered names."""
    import inspect

    functions = {}
    for name, obj in vars(V).items():
        if name.startswith("_") or getattr(obj, "__module__", "") != V.__name__ or not inspect.isfunction(obj):
            continue
        functions[name] = [
            [param, None if p.default is inspect.Parameter.empty else repr(p.default), p.kind.name]
            for param, p in inspect.signature(obj).parameters.items()
        ]
    classes = sorted(n for n, o in vars(V).items() if inspect.isclass(o) and o.__module__ == V.__name__)
    return {
        "functions": functions,
        "classes": classes,
        "adv_estimators": [e.value for e in V.AdvantageEstimator],
        "adv_registry": sorted(V.ADV_ESTIMATOR_REGISTRY),
        "policy_losses": sorted(V.POLICY_LOSS_REGISTRY),
    }


def main() -> None:
    inputs = make_inputs()
    outputs = run_cases(VerlImpl(), inputs)
    golden = {
        "source": f"verl {getattr(verl, '__version__', '?')} verl/trainer/ppo/core_algos.py (PyPI wheel)",
        "inputs": inputs_to_json(inputs),
        "outputs": {name: [float(f"{v:.9g}") for v in t.flatten().tolist()] if t.dim() else float(f"{t.item():.9g}")
                    for name, t in outputs.items()},
        "shapes": {name: list(t.shape) for name, t in outputs.items()},
        "api": public_api(),
    }
    path = Path(__file__).with_name("core_algos_verl_golden.json")
    path.write_text(json.dumps(golden, separators=(",", ":")))
    print(f"wrote {len(outputs)} cases to {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
