"""The trainer's promotion policy (``trainer_svc.promotion``) and its one staleness rule
(``trainer_svc.staleness``): AllAtOnce gates nothing, Canary decides what is offered, what a
step publishes and when the trainer stops; the factory builds the policy of a view."""

from __future__ import annotations

import pytest
import torch

from services.config.job import parse_job
from services.config.views import derive_view
from services.config.weights import REJECT_EXIT_CODE, WeightChannelConfig
from trainer_svc.promotion import AllAtOnce, PromotionPolicy, make_policy
from trainer_svc.promotion.canary import META_KEY, Canary
from trainer_svc.staleness import Staleness
from trainer_svc.synthetic import make_group
from trainer_svc.weights.publisher import WeightPublisher
from tests.fixtures.specs import MINIMAL_SPEC


def test_staleness_is_one_rule_for_samples_and_for_the_promoted_version():
    s = Staleness(2)
    assert [s.trainable(v, at=5) for v in (2, 3, 4, 5, 6)] == [False, True, True, True, False]  # 6: from the future
    assert s.stale(torch.tensor([2, 3, 5, 6]), at=5).tolist() == [True, False, False, True]
    # the promoted version is at the limit when one more step makes its samples untrainable
    assert [s.at_limit(p, at=5) for p in (2, 3, 4)] == [True, True, False]
    assert Staleness.of(s) is s and Staleness.of(3) == Staleness(3)
    with pytest.raises(ValueError):
        Staleness(-1)


def _group(version: int):
    g = make_group("u", n=2, prompt_len=3, response_len=4, vocab_size=32, seed=0)
    g.batch["policy_version"] = torch.full((2,), version, dtype=torch.long)
    return g


class Item:
    def __init__(self, i: str, data) -> None:
        self.id, self.data = i, data


def test_all_at_once_gates_nothing_every_version_goes_out():
    p = AllAtOnce(Staleness(1))
    batch = _group(3)
    for version in range(4):  # whatever the trainer's version, nothing is offered, held, rejected or skipped
        assert p.next_command(version) is None and p.offer(version) is None
        assert p.wait_resumed(version, lambda: None, lambda: False) is None
        assert not p.screen(Item("a", batch), batch, version)
        assert p.step_control(batch, version) == {}  # the step's version is published
    assert p.rejected(torch.tensor([0, 1, 2])).tolist() == [False] * 3
    assert p.released() == [] and not p.judging_due() and p.held_samples() == 0
    assert p.status() == {"canary": None} and not p.judges(batch)


def _canary(**rollout) -> tuple[Canary, WeightPublisher]:
    pub = WeightPublisher(WeightChannelConfig(control_port=0, rollout={"mode": "canary", **rollout}))
    return Canary(pub.cfg.rollout, pub, batch_samples=4, max_staleness=Staleness(2)), pub


def test_canary_offers_the_next_candidate_only_when_the_gate_takes_one():
    gate, pub = _canary()
    pub.rollout.routed(0, "promote")
    assert gate.next_command(1) == {"cmd": "publish"}  # v1 never reached the gate: the next candidate
    pub.rollout.routed(1, "canaries")
    assert gate.next_command(2) is None  # v1 under test: the trainer steps on
    # a step while v1 is under test goes nowhere: not gathered; a judging step offers its starting weights
    assert gate.step_control(_group(0), 2) == {"publish": False}
    judging = _group(1)
    judging.meta_info[META_KEY] = {"version": 1}
    assert gate.judges(judging) and gate.step_control(judging, 2) == {"publish": True, "offer_on_promotion": True}


def test_canary_decisions_reach_the_publisher_and_on_reject_fail_stops_the_trainer():
    gate, pub = _canary(on_reject="fail")
    pub.rollout.routed(0, "promote")
    pub.rollout.routed(1, "canaries")
    gate.decide({"version": 1, "promoted": True, "reason": "", "measurements": {"logprob_gap": 0.0, "judged_lag": 0}})
    assert pub.rollout.promoted == 1 and gate.reference_gap == 0.0
    pub.rollout.routed(2, "canaries")
    gate.decide({"version": 2, "promoted": False, "reason": "logprob_gap 3.2", "measurements": {}})
    assert 2 in pub.rollout.rejected
    assert gate.next_command(3) == {"cmd": "stop", "checkpoint": True, "code": REJECT_EXIT_CODE}
    assert gate.status()["canary"]["failed"].startswith("v2 rejected")


def test_canary_report_carries_the_verdict_of_a_judging_step():
    from trainer_svc.worker import StepResult

    gate, _ = _canary()

    def Result(verdict):  # noqa: N802 - a step's result, with or without a verdict
        return StepResult(version=1, applied=True, samples=8, tokens=64, optimizer_steps=1, skipped_steps=0,
                          metrics={"training/rollout_logprob_gap_mean": 0.25}, verdict=verdict)

    gate.after_step(Result(None))  # a step without a candidate: its gap is the next baseline
    assert gate.last_gap == 0.25 and gate.report(Result(None)) == {}
    verdict = {"version": 1, "promoted": True}
    assert gate.report(Result(verdict)) == {"canary": verdict}


def _view(*overrides: str):
    return derive_view(parse_job(MINIMAL_SPEC, list(overrides)), "trainer")


def test_the_factory_builds_the_policy_of_a_view_with_its_staleness_budget():
    p = make_policy(_view("async.max_staleness=2"))
    assert type(p) is AllAtOnce and p.staleness == Staleness(2)
    view = _view("weights.rollout.mode=canary", "services.rollout.replicas=2")
    pub = WeightPublisher(view.weights)
    p = make_policy(view, pub)
    assert type(p) is Canary and p.publisher is pub
    assert p.staleness == Staleness(view.async_.max_staleness) == Staleness(4)  # the views' sized budget
    assert p.needed == view.weights.rollout.promote_after_samples and p.window == view.async_.max_in_flight
    follower = make_policy(view)  # another rank: it judges and keeps offered weights, decides nothing
    assert follower.rollout is None and follower.next_command(5) is None and follower.status() == {"canary": None}
    assert isinstance(follower, PromotionPolicy)
