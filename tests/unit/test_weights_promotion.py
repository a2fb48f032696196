"""The canary gate's bookkeeping on the publisher (``trainer_svc.weights.promotion``)."""

from __future__ import annotations

import pytest

from services.config.weights import RolloutGateConfig, WeightChannelConfig
from services.weights.errors import VersionError
from trainer_svc.weights.promotion import RolloutState, replica_of


def gate(**kw) -> RolloutState:
    return RolloutState(RolloutGateConfig(mode="canary", **kw))


def publish(s: RolloutState, version: int, promote: bool = False) -> str:
    route = s.route(promote)
    s.routed(version, route)
    return route


def test_mode_all_sends_every_version_everywhere_and_names_no_target():
    s = RolloutState(RolloutGateConfig())
    assert [publish(s, v, promote=(v == 0)) for v in range(3)] == ["all", "all", "all"]
    assert s.promoted == 2 and s.candidate is None and s.target("r0") is None
    s.assign([("r0", False)])
    assert s.canaries == set()


def test_one_candidate_at_a_time_the_rest_held_back_until_the_verdict():
    s = gate()
    s.assign([("r1", False), ("r0", False), ("serve-x", True)])
    assert publish(s, 0, promote=True) == "promote"
    assert s.target("r0") == (0, True) and s.target("r1") == (0, False) and s.target("serve-x") == (0, False)
    assert publish(s, 1) == "canaries"
    assert s.target("r0") == (1, True) and s.target("r1") == (0, False)
    assert not s.wants_next()
    assert [publish(s, v) for v in (2, 3)] == ["held_back", "held_back"] and s.held_back == 2
    s.promote(1, {"logprob_gap": 0.01})
    assert s.target("r0") == (1, True) and s.target("r1") == (1, False) and s.target("serve-x") == (1, False)
    assert publish(s, 4) == "canaries"
    s.reject(4, "logprob_gap too high")
    assert s.target("r0") == (1, True), "the canary goes back to the promoted version"
    assert s.rejected == {4: "logprob_gap too high"} and s.wants_next()
    assert publish(s, 5) == "canaries"
    kinds = [(e.version, e.kind) for e in s.events]
    assert kinds == [(0, "promoted"), (1, "candidate"), (1, "promoted"), (4, "candidate"), (4, "rejected"),
                     (5, "candidate")]


def test_only_the_candidate_can_be_decided():
    s = gate()
    publish(s, 0, promote=True)
    publish(s, 1)
    for bad in (0, 2):
        with pytest.raises(VersionError, match="not the candidate"):
            s.promote(bad)
        with pytest.raises(VersionError, match="not the candidate"):
            s.reject(bad, "x")
    s.promote(1)
    with pytest.raises(VersionError):
        s.promote(1)


def test_a_pause_holds_every_version_back_until_resumed():
    s = gate(on_reject="pause")
    publish(s, 0, promote=True)
    publish(s, 1)
    s.reject(1, "bad", pause=True)
    assert s.paused.startswith("v1 rejected") and publish(s, 2) == "held_back"
    with pytest.raises(VersionError, match="not paused"):
        RolloutState(RolloutGateConfig(mode="canary")).resume()
    s.resume("operator")
    assert s.paused == "" and publish(s, 3) == "canaries"
    assert [e.kind for e in s.events][-3:] == ["paused", "resumed", "candidate"]


def test_seats_are_sticky_never_given_to_promoted_only_and_shared_by_tp_workers():
    s = gate(canary_replicas=1)
    s.assign([("serve-a", True)])
    assert s.canaries == set(), "the live-policy endpoint is never a canary"
    s.assign([("rollout-1", False), ("serve-a", True)])
    assert s.canaries == {"rollout-1"}
    s.assign([("rollout-0", False), ("rollout-1", False), ("serve-a", True)])
    assert s.canaries == {"rollout-1"}, "a canary keeps its seat while it is subscribed"
    s.assign([("rollout-0", False), ("serve-a", True)])
    assert s.canaries == {"rollout-0"}, "a free seat goes to the next replica"
    s.assign([("rollout-0", False), ("rollout-0.w1", False), ("rollout-1", False)])
    assert s.canaries == {"rollout-0"} and s.is_canary("rollout-0.w1") and not s.is_canary("rollout-1")
    assert replica_of("r.w2") == "r" and replica_of("r.wx") == "r.wx" and replica_of(".w1") == ".w1"
    two = gate(canary_replicas=2)
    two.assign([("c", False), ("a", False), ("b", False)])
    assert two.canaries == {"a", "b"}


def test_canary_mode_needs_snapshots():
    with pytest.raises(ValueError, match="weights.snapshot=true"):
        WeightChannelConfig(snapshot=False, rollout={"mode": "canary"})
    assert WeightChannelConfig(rollout={"mode": "canary"}).canary
