"""FSDP2 on real gloo ranks gives the same update as one rank and as plain PyTorch.

Runs ``tests/integration/trainer_step_job.py`` twice on the tiny model:
- 1 rank, fixed micro-batches of 2, one step;
- 2 ranks, dynamic micro-batches (token budget), two steps where the second step's
  rewards contain a NaN -- that step must be skipped, leaving the weights of step one.
Both must match an in-process, un-sharded reference update on the same batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = str(Path(__file__).with_name("trainer_step_job.py"))


def _spec(model: str, **actor) -> dict:
    base = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "optim": {"lr": 1e-3}}
    base.update(actor)
    return {"model": {"path": model}, "data": {"train_batch_size": 4}, "rollout": {"n": 2}, "actor": base}


def _run(tmp: Path, spec: dict, nproc: int, *extra: str) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    from trainer_svc.launch import spawn_ranks

    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "spec.json").write_text(json.dumps(spec))
    code = spawn_ranks([JOB, str(tmp / "spec.json"), str(tmp / "out"), *extra], nproc, threads=1, timeout_s=500)
    assert code == 0, f"{nproc}-rank job failed with exit code {code}"
    return json.loads((tmp / "out" / "result.json").read_text()), load_file(str(tmp / "out" / "params.safetensors"))


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    one = _run(root / "one", _spec(tiny_model), 1)
    two = _run(
        root / "two",
        _spec(tiny_model, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=24, log_prob_max_token_len_per_gpu=24),
        2,
        "--steps", "2", "--nan-step", "1",
    )
    return one, two


def _reference(tiny_model: str):
    """The same step without FSDP or torch.distributed: plain HF model, one process.
    The batch comes back with its ``old_log_probs`` (the step's recompute)."""
    from services.config.trainer import ActorConfig, AlgorithmConfig
    from trainer_svc.actor import DataParallelPPOActor
    from trainer_svc.experience import compute_advantage
    from trainer_svc.fsdp import build_optimizer, load_causal_lm
    from trainer_svc.synthetic import make_batch

    model = load_causal_lm(tiny_model)
    cfg = ActorConfig(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8, optim={"lr": 1e-3})
    opt, _ = build_optimizer(model, cfg.optim, 1)
    actor = DataParallelPPOActor(cfg, model, opt, mini_batch_size=8)
    batch = make_batch(4, n=2, prompt_len=7, response_len=6, vocab_size=model.config.vocab_size, seed=0)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    compute_advantage(batch, AlgorithmConfig())
    res = actor.update_policy(batch)
    return res, {n: p.detach().clone() for n, p in model.named_parameters()}, batch


def test_one_rank_fsdp_matches_plain_pytorch(runs, tiny_model):
    (res1, params1), _ = runs
    ref_res, ref_params, _ = _reference(tiny_model)
    m = res1["steps"][0]["metrics"]
    assert m["actor/pg_loss"] == pytest.approx(ref_res.metrics["actor/pg_loss"], rel=1e-4, abs=1e-6)
    assert m["actor/grad_norm"] == pytest.approx(ref_res.metrics["actor/grad_norm"], rel=1e-4)
    for name, p in ref_params.items():
        torch.testing.assert_close(params1[name], p, atol=2e-5, rtol=1e-4, msg=f"parameter {name} differs")


def test_two_ranks_match_one_rank(runs, tiny_model):
    (res1, params1), (res2, params2) = runs
    assert res1["world"] == 1 and res2["world"] == 2
    m1, m2 = res1["steps"][0]["metrics"], res2["steps"][0]["metrics"]
    for key in ("actor/pg_loss", "actor/loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    assert res2["steps"][0]["version"] == 1 and res2["steps"][0]["applied"]
    start = _initial(tiny_model)
    moved = max((params1[n] - start[n]).abs().max().item() for n in start)
    assert moved > 1e-4, "the update did not change the weights"
    for name in params1:
        torch.testing.assert_close(params2[name], params1[name], atol=2e-5, rtol=1e-4, msg=f"parameter {name} differs")


def test_nan_step_is_skipped_and_reported(runs):
    _, (res2, _) = runs
    bad = res2["steps"][1]
    assert bad["applied"] is False
    assert bad["skipped"] == 1
    assert bad["version"] == 1, "a skipped step must not bump the policy version"
    assert not (bad["metrics"]["actor/grad_norm"] == bad["metrics"]["actor/grad_norm"]) or bad["metrics"]["actor/grad_norm"] == float("inf")


def test_mixed_precision_computes_in_bf16_over_a_float32_master_copy(tiny_model, tmp_path):
    """``fsdp_config.mixed_precision`` on one rank: FSDP2 wraps the model anyway and each layer
    computes in bf16 (the log-probs differ from float32's, by bf16's rounding only), while the
    parameters stay float32 and take about the float32 step's update."""
    from safetensors.torch import load_file

    spec = _spec(tiny_model, fsdp_config={"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}})
    res, params = _run(tmp_path, spec, 1)
    _, ref_params, ref_batch = _reference(tiny_model)
    assert res["steps"][0]["applied"] and res["steps"][0]["version"] == 1
    mask = ref_batch.batch["response_mask"].bool()
    got = load_file(str(tmp_path / "out" / "log_probs.safetensors"))["step0"]
    gap = (got - ref_batch.batch["old_log_probs"]).abs()[mask]
    assert gap.max() > 1e-4, "log-probs equal float32's: the layers did not compute in bf16"
    assert gap.mean() < 0.05, f"bf16 log-probs are {gap.mean():.4f} from float32's on average"
    start = _initial(tiny_model)
    assert all(params[n].dtype == torch.float32 for n in start), "the master parameters must stay float32"
    ours = torch.cat([(params[n] - start[n]).flatten() for n in start])
    ref = torch.cat([(ref_params[n] - start[n]).flatten() for n in start])
    assert ours.abs().max() > 1e-4, "the update did not change the weights"
    assert torch.nn.functional.cosine_similarity(ours, ref, dim=0) > 0.9, "the bf16 update points elsewhere"


def _initial(tiny_model: str) -> dict:
    from trainer_svc.fsdp import load_causal_lm

    return {n: p.detach() for n, p in load_causal_lm(tiny_model).named_parameters()}


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


def test_ppo_with_critic_reference_and_kl_on_two_ranks(tiny_model, tmp_path):
    """GAE with an FSDP2 critic, a reference policy, KL loss and adaptive KL-in-reward."""
    spec = _spec(tiny_model, ppo_mini_batch_size=2, use_kl_loss=True)
    spec["critic"] = {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2}
    spec["algorithm"] = {"adv_estimator": "gae", "use_kl_in_reward": True, "kl_ctrl": {"type": "adaptive"}}
    res, _ = _run(tmp_path, spec, 2, "--steps", "2")
    first, second = res["steps"]
    assert [first["version"], second["version"]] == [1, 2]
    for step in (first, second):
        m = step["metrics"]
        assert all(v == v for v in m.values()), m  # no NaN anywhere
        assert m["critic/vf_loss"] > 0 and m["critic/grad_norm"] > 0
    # the policy moved away from the reference: both KL terms are positive on step two
    assert second["metrics"]["actor/kl_loss"] > 0
    assert second["metrics"]["actor/reward_kl_penalty"] > 0


@pytest.mark.parametrize("mode", ["always", "stale"])
def test_old_log_probs_of_on_policy_rows_are_the_replicas_only_when_asked(tiny_model, tmp_path, mode):
    """``actor.recompute_old_log_prob``: with ``stale`` the rows the trainer's current weights
    generated keep the replica's log-probs and only the others are recomputed (on 2 ranks, so
    the sub-batch is sharded and gathered); with ``always`` (verl's) every row is recomputed."""
    from trainer_svc.launch import spawn_ranks

    spec = _spec(tiny_model, recompute_old_log_prob=mode)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    code = spawn_ranks([JOB, str(tmp_path / "spec.json"), str(tmp_path / "out"), "--reuse-check"], 2, threads=1,
                       timeout_s=300)
    assert code == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert res["stale_max_diff_from_trainer"] < 1e-5  # older rows: recomputed either way
    if mode == "stale":
        assert res["fresh_max_diff_from_replica"] == 0.0  # the replica's numbers, untouched
        assert res["metrics"]["actor/old_log_prob_reused"] == 0.5
        # the trainer-vs-replica metrics cover the recomputed rows only: the whole offset
        assert abs(res["metrics"]["training/rollout_logprob_gap_mean"] - 0.5) < 1e-5
    else:
        assert abs(res["fresh_max_diff_from_replica"] - 0.5) < 1e-5  # recomputed: the trainer's own
        assert "actor/old_log_prob_reused" not in res["metrics"]


def test_a_judging_batchs_verdict_is_handed_over_before_the_updates(tiny_model, tmp_path):
    """Canary mode: the step that judges a candidate gives rank 0 its verdict as soon as the
    old log-probs are recomputed -- the parameters are still the step's starting ones, so
    the promoted replicas start loading the version while the step updates (2 ranks: only
    rank 0 decides, and the step still completes on both); then every rank can gather those
    starting weights, the next candidate, before the updates."""
    from trainer_svc.launch import spawn_ranks

    (tmp_path / "spec.json").write_text(json.dumps(_spec(tiny_model)))
    code = spawn_ranks([JOB, str(tmp_path / "spec.json"), str(tmp_path / "out"), "--canary-check"], 2, threads=1,
                       timeout_s=300)
    assert code == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert res["calls"] == [{"verdict": True, "params_unchanged": True, "version": 0, "removed": 0}]
    # then every rank gathers the step's starting weights within the step (offered as the next candidate)
    assert res["gathered"] == [{"verdict": True, "version": 0, "starting_weights": True}]
    assert res["result_promoted"] and res["applied"] and res["version"] == 1 and res["params_changed_after"]
    assert res["full_changed_after"]


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_candidate_is_judged_with_its_own_weights_after_the_trainer_stepped_past_it(tiny_model, tmp_path, nproc):
    """Canary mode: each rank keeps its shards of the weights it offers; two steps later the
    candidate's samples are recomputed with them (lag 0), so a faithful canary's gap is ~0
    and passes a tight bound, where the current weights' gap -- the policy's own change --
    fails it. Judging swaps the weights in and out again: nothing of either is lost."""
    from trainer_svc.launch import spawn_ranks

    (tmp_path / "spec.json").write_text(json.dumps(_spec(tiny_model)))
    code = spawn_ranks([JOB, str(tmp_path / "spec.json"), str(tmp_path / "out"), "--lag0-check"], nproc, threads=1,
                       timeout_s=300)
    assert code == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    assert res["version"] == 2
    assert res["kept"]["lag"] == 0 and res["kept"]["gap"] < 1e-4 and res["kept"]["promoted"], res
    assert res["dropped"]["lag"] == 2 and res["dropped"]["gap"] > 0.05 and not res["dropped"]["promoted"], res
    assert res["model_restored"] and res["copy_intact"] and res["copy_on_host"]
