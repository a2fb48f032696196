"""The trainer's side of the canary gate: the verdict of a step, the intake's bounds, the
settings a canary job needs (``trainer_svc.promotion.canary``, ``services.config``)."""

from __future__ import annotations

import math

import pytest
import torch

from services.config.job import parse_job
from services.config.weights import RolloutGateConfig, WeightChannelConfig
from trainer_svc.weights.publisher import WeightPublisher
from trainer_svc.promotion.canary import Canary as CanaryGate, judge
from trainer_svc.synthetic import make_group


def batch(versions: list[int], p_rollout: list[float], p_trainer: list[float]):
    """One row per version; every response token has those probabilities."""
    g = make_group("u", n=len(versions), prompt_len=3, response_len=4, vocab_size=32, seed=1)
    b = g.batch
    b["policy_version"] = torch.tensor(versions)
    b["response_mask"] = torch.ones(len(versions), 4)
    b["rollout_log_probs"] = torch.tensor(p_rollout).log()[:, None].expand(-1, 4).clone()
    b["old_log_probs"] = torch.tensor(p_trainer).log()[:, None].expand(-1, 4).clone()
    return g


SPEC = {"version": 7, "max_logprob_gap_increase": 0.1, "promoted_logprob_gap": None, "measurements": {"samples": 2.0}}


def test_a_candidate_close_to_the_promoted_rows_is_promoted_and_only_its_too_stale_rows_leave():
    b = batch([7, 7, 6, 5], p_rollout=[0.50, 0.40, 0.30, 0.60], p_trainer=[0.45, 0.42, 0.27, 0.66])
    verdict, removed = judge(b, SPEC, current_version=8, max_staleness=3)
    assert verdict["promoted"] and verdict["reason"] == ""
    m = verdict["measurements"]
    gap = lambda a, c: abs(math.log(a) - math.log(c))  # noqa: E731
    assert m["logprob_gap"] == pytest.approx((gap(0.5, 0.45) + gap(0.4, 0.42)) / 2)
    assert m["promoted_logprob_gap"] == pytest.approx((gap(0.3, 0.27) + gap(0.6, 0.66)) / 2)
    assert m["samples"] == 2.0 and m["judged_samples"] == 2.0
    assert removed.tolist() == [False, False, False, False]
    _, removed = judge(b, SPEC, current_version=11, max_staleness=3)  # 11 - 7 > 3: judged, then left out
    assert removed.tolist() == [True, True, False, False]


def test_a_candidate_far_from_the_trainer_is_rejected_and_all_its_rows_leave():
    b = batch([7, 6, 7], p_rollout=[0.9, 0.5, 0.8], p_trainer=[0.1, 0.5, 0.2])
    verdict, removed = judge(b, SPEC, current_version=7, max_staleness=1)
    assert not verdict["promoted"] and "logprob_gap 1.7918 vs promoted 0.0000" in verdict["reason"]
    assert removed.tolist() == [True, False, True]


def test_a_flat_distribution_wrong_by_a_sign_is_caught_by_the_log_gap():
    """The tiny test model's distribution is almost flat (p ~ 1/512): weights whose logits
    flip sign move each p by ~1e-3 -- no probability bound sees it -- but log p by ~0.4."""
    b = batch([7, 6], p_rollout=[0.0015, 0.002], p_trainer=[0.0025, 0.002])
    verdict, _ = judge(b, SPEC, current_version=7, max_staleness=1)
    assert not verdict["promoted"] and verdict["measurements"]["logprob_gap"] == pytest.approx(math.log(0.0025 / 0.0015))


def test_without_promoted_rows_the_last_step_figure_is_the_baseline():
    b = batch([7, 7], p_rollout=[0.5, 0.5], p_trainer=[0.4, 0.4])
    assert not judge(b, SPEC, 7, 1)[0]["promoted"]  # no baseline: 0.22 > 0 + 0.1
    verdict, _ = judge(b, {**SPEC, "promoted_logprob_gap": 0.15}, 7, 1)
    assert verdict["promoted"] and verdict["measurements"]["promoted_logprob_gap"] == 0.15


class Item:
    def __init__(self, i: str, data) -> None:
        self.id, self.data = i, data


def test_the_intake_bounds_compare_the_candidate_with_the_promoted_samples():
    pub = WeightPublisher(WeightChannelConfig(control_port=0, rollout={"mode": "canary"}))
    pub.rollout.routed(0, "promote")
    pub.rollout.routed(1, "canaries")
    gate = CanaryGate(RolloutGateConfig(mode="canary", promote_after_samples=4, max_error_rate_increase=0.2,
                                        max_reward_drop=0.3), pub, batch_samples=16)
    assert gate.candidate_version() == 1
    gate.observe_promoted(torch.tensor([False, False, False, True]), torch.tensor([1.0, 1.0, 0.0, 0.0]))
    gate.hold(Item("a", None), torch.tensor([True, False]), torch.tensor([0.0, 0.0]))
    assert not gate.ready()
    gate.hold(Item("a", None))  # the same item handed back: counted once
    assert not gate.ready()
    gate.hold(Item("b", None), torch.tensor([True, False]), torch.tensor([0.0, 1.0]))
    assert gate.ready() and gate.is_held("a") and gate.is_held("b")
    reasons, m = gate.intake_verdict()
    assert m["error_rate"] == 0.5 and m["promoted_error_rate"] == 0.25
    assert m["reward"] == 0.5 and m["promoted_reward"] == pytest.approx(2 / 3)
    assert len(reasons) == 1 and reasons[0].startswith("error rate 0.500 vs promoted 0.250")
    dropped = gate.reject_at_intake(reasons, m)
    assert [it.id for it in dropped] == ["a", "b"]
    assert pub.rollout.rejected == {1: reasons[0]} and pub.rollout.candidate is None
    assert gate.rejected(torch.tensor([0, 1, 2])).tolist() == [False, True, False]


def test_a_judged_candidate_releases_what_arrived_meanwhile_and_on_reject_fail_stops():
    pub = WeightPublisher(WeightChannelConfig(control_port=0, rollout={"mode": "canary", "on_reject": "fail"}))
    pub.rollout.routed(0, "promote")
    pub.rollout.routed(3, "canaries")
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=64)
    gate.candidate_version()
    for i in "abc":
        gate.hold(Item(i, None), torch.tensor([False] * 16), torch.ones(16))
    items, spec = gate.take_for_judging(limit=2)
    assert [it.id for it in items] == ["a", "b"] and spec["version"] == 3 and not gate.ready()
    assert spec["measurements"]["samples"] == 48.0 and math.isnan(gate.intake_verdict()[1].get("promoted_reward",
                                                                                                  math.nan))
    gate.observe_step({"training/rollout_logprob_gap_mean": 0.03})
    assert gate.last_gap == 0.03
    gate.decide({"version": 3, "promoted": False, "reason": "logprob_gap", "measurements": {"promoted_logprob_gap": 0.02}})
    assert [it.id for it in gate.take_released()] == ["c"] and gate.take_released() == []
    assert gate.failed.startswith("v3 rejected") and gate.last_gap == 0.02


def spec(**over):
    raw = {"name": "c", "model": {"path": "m"}, "data": {"train_files": ["t.parquet"], "train_batch_size": 4},
           "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 4},
           "services": {"rollout": {"replicas": 2}}, "weights": {"rollout": {"mode": "canary"}}}
    return parse_job(raw, [f"{k}={v}" for k, v in over.items()])


def test_a_canary_job_is_checked_against_the_other_blocks():
    assert spec().weights.rollout.samples_to_decide(16) == 8
    for over, needle in (
        ({"services.rollout.replicas": 1}, "canary_replicas (1) must be below services.rollout.replicas (1)"),
        ({"async.mode": "sync", "async.max_staleness": 0}, "with async.mode=sync"),
        ({"rollout.calculate_log_probs": "false"}, "rollout.calculate_log_probs=true"),
        ({"weights.rollout.promote_after_samples": 17}, "exceeds one batch"),
    ):
        with pytest.raises(Exception, match=needle.replace("(", r"\(").replace(")", r"\)")):
            spec(**over)


def test_a_batch_without_the_candidates_rows_never_promotes_it():
    b = batch([6, 6], p_rollout=[0.5, 0.5], p_trainer=[0.5, 0.5])
    verdict, removed = judge(b, SPEC, current_version=7, max_staleness=3)
    assert not verdict["promoted"] and "no sampled token of the candidate" in verdict["reason"]
    assert not bool(removed.any())


def test_the_judging_batch_takes_the_candidates_groups_before_parked_ones():
    pub = WeightPublisher(WeightChannelConfig(control_port=0, rollout={"mode": "canary"}))
    pub.rollout.routed(0, "promote")
    pub.rollout.routed(1, "canaries")
    gate = CanaryGate(pub.cfg.rollout, pub, batch_samples=8, max_staleness=1, park_limit=2)
    gate.candidate_version()
    assert gate.park(Item("p0", None), current_version=1) and gate.park(Item("p1", None), current_version=1)
    assert not gate.park(Item("p2", None), current_version=1), "past the park limit"
    gate.hold(Item("c0", None), torch.tensor([False] * 4), torch.ones(4))
    items, _ = gate.take_for_judging(limit=2)
    assert [it.id for it in items] == ["c0", "p0"]
    gate.decide({"version": 1, "promoted": True, "reason": "", "measurements": {}})
    assert [it.id for it in gate.take_released()] == ["p1"]


def test_rejected_weights_the_promoted_replicas_are_too_stale_for_are_offered_again_once():
    from trainer_svc.weights.promotion import RolloutState
    from trainer_svc.promotion.canary import next_offer

    r = RolloutState(RolloutGateConfig(mode="canary"))
    r.routed(1, "promote")
    r.routed(5, "canaries")  # the trainer stepped 4 versions past v1 before offering v5
    assert next_offer(r, 5, published=5, offered_again=-1, max_staleness=3) is None  # under test: held back
    r.reject(5, "logprob_gap")
    # v1's samples are 4 versions behind v5: none can be trained, so v5's weights go out again as v6
    assert next_offer(r, 5, published=5, offered_again=-1, max_staleness=3) == "again"
    # within max_staleness the trainer steps on the promoted replicas' samples instead
    assert next_offer(r, 5, published=5, offered_again=-1, max_staleness=4) is None
    r.routed(6, "canaries")
    r.reject(6, "logprob_gap")
    assert next_offer(r, 6, published=6, offered_again=6, max_staleness=3) == "fail"  # the same weights, twice
    # weights made since the last offer are always offered, and nothing while paused
    assert next_offer(r, 7, published=6, offered_again=6, max_staleness=3) == "new"
    r.routed(7, "canaries")
    r.reject(7, "error rate", pause=True)
    assert next_offer(r, 8, published=7, offered_again=6, max_staleness=3) is None


def test_weights_held_back_by_a_pause_are_offered_under_the_next_number_after_the_resume():
    """Seen in a job: v4 rejected with pause while the judging step published v5 (held back);
    after the resume v5's number was taken and v1 was 4 versions behind: nothing to train."""
    from trainer_svc.weights.promotion import RolloutState
    from trainer_svc.promotion.canary import next_offer

    r = RolloutState(RolloutGateConfig(mode="canary"))
    r.routed(1, "promote")
    r.routed(4, "canaries")
    r.reject(4, "logprob_gap", pause=True)
    r.routed(5, r.route(False))  # the judging step's own version, published after the verdict
    assert r.held_back == 1
    assert next_offer(r, 5, published=5, offered_again=-1, max_staleness=3) is None  # paused
    r.resume("an operator")
    assert next_offer(r, 5, published=5, offered_again=-1, max_staleness=3) == "renumber"
    assert next_offer(r, 6, published=5, offered_again=-1, max_staleness=3) == "new"


def test_the_judging_step_offers_its_starting_weights_only_when_they_never_reached_the_gate():
    from trainer_svc.weights.promotion import RolloutState
    from trainer_svc.promotion.canary import offer_on_promotion

    r = RolloutState(RolloutGateConfig(mode="canary"))
    r.routed(0, "promote")
    assert not offer_on_promotion(r, 1, published=0)  # no candidate under test: nothing to judge
    r.routed(1, "canaries")
    # the trainer stepped to v2 while v1 was under test (v2 never gathered): offered on the promotion
    assert offer_on_promotion(r, 2, published=1)
    # the candidate is the trainer's own weights (it judged before stepping): they went out already
    assert not offer_on_promotion(r, 1, published=1)
    # v2's number was taken by a publish held back meanwhile: left to the end of the step (renumbered there)
    assert not offer_on_promotion(r, 2, published=2)
    r.promote(1)
    r.routed(3, "canaries")
    r.reject(3, "logprob_gap")
    r.routed(4, "canaries")
    assert not offer_on_promotion(r, 3, published=4)  # older than what the gate has seen
    assert offer_on_promotion(r, 5, published=4)
