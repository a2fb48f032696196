"""verl's registries behave like verl's: code that rebinds or edits
``core_algos.ADV_ESTIMATOR_REGISTRY`` / ``POLICY_LOSS_REGISTRY`` (as verl's own tests do)
sees its change through ``register_*`` / ``get_*``, and unknown names fail as in verl."""

from __future__ import annotations

import pytest
import torch

import trainer_svc.core_algos as ca
from services.protocol import DataProto
from trainer_svc.algos import registry


def _double(x):
    return x * 2


def _plus_one(x):
    return x + 1


def test_rebinding_the_advantage_registry_is_what_lookups_and_registrations_use(monkeypatch) -> None:
    built_in = ca.ADV_ESTIMATOR_REGISTRY
    monkeypatch.setattr(ca, "ADV_ESTIMATOR_REGISTRY", {"gae": _double, "vtrace": _plus_one})
    assert ca.get_adv_estimator_fn("gae")(5) == 10
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GAE) is _double
    assert ca.get_adv_estimator_fn("vtrace")(5) == 6
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: grpo"):
        ca.get_adv_estimator_fn("grpo")  # built in, but not in the registry now in place

    @ca.register_adv_est("test_rebound")
    def estimator():
        return "mine"

    assert ca.ADV_ESTIMATOR_REGISTRY["test_rebound"] is estimator
    assert "test_rebound" not in built_in
    with pytest.raises(ValueError, match="already been registered"):
        ca.register_adv_est("vtrace")(_double)
    monkeypatch.undo()
    assert ca.ADV_ESTIMATOR_REGISTRY is built_in
    assert ca.get_adv_estimator_fn("gae") is ca.compute_gae_advantage_return
    with pytest.raises(ValueError):
        ca.get_adv_estimator_fn("test_rebound")


def test_rebinding_the_policy_loss_registry_is_what_lookups_and_registrations_use(monkeypatch) -> None:
    built_in = ca.POLICY_LOSS_REGISTRY
    monkeypatch.setattr(ca, "POLICY_LOSS_REGISTRY", {"vanilla": _double})
    assert ca.get_policy_loss_fn("vanilla") is _double
    with pytest.raises(ValueError, match=r"Unsupported loss mode: gspo\. Supported modes are: \['vanilla'\]"):
        ca.get_policy_loss_fn("gspo")

    @ca.register_policy_loss("test_rebound_loss")
    def loss():
        return None

    assert ca.POLICY_LOSS_REGISTRY == {"vanilla": _double, "test_rebound_loss": loss}
    assert "test_rebound_loss" not in built_in
    monkeypatch.undo()
    assert ca.get_policy_loss_fn("vanilla") is ca.compute_policy_loss_vanilla
    with pytest.raises(ValueError, match="Unsupported loss mode: test_rebound_loss"):
        ca.get_policy_loss_fn("test_rebound_loss")


def test_replacing_an_entry_is_seen_by_the_lookup_and_the_dispatcher(monkeypatch) -> None:
    calls = []

    def my_rloo(token_level_rewards, response_mask, index, config=None, **kwargs):
        calls.append(list(index))
        adv = torch.full_like(token_level_rewards, 7.0) * response_mask
        return adv, adv

    monkeypatch.setitem(ca.ADV_ESTIMATOR_REGISTRY, "rloo", my_rloo)
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.RLOO) is my_rloo
    mask = torch.ones(2, 3)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), "response_mask": mask},
        non_tensors={"uid": ["a", "a"]},
    )
    out = ca.compute_advantage(data, adv_estimator="rloo")
    assert calls == [["a", "a"]]
    assert torch.equal(out.batch["advantages"], torch.full((2, 3), 7.0))

    monkeypatch.setitem(ca.POLICY_LOSS_REGISTRY, "vanilla", _plus_one)
    assert ca.get_policy_loss_fn("vanilla") is _plus_one


def test_the_internal_module_binding_is_honoured_too(monkeypatch) -> None:
    """Rebinding the dict in trainer_svc.algos.registry (where verl-less code may reach for
    it) works as long as core_algos still binds the built-in dict."""
    monkeypatch.setattr(registry, "ADV_ESTIMATOR_REGISTRY", {"only": _double})
    assert ca.get_adv_estimator_fn("only") is _double
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: gae"):
        ca.get_adv_estimator_fn("gae")


def test_unknown_names_fail_as_in_verl() -> None:
    with pytest.raises(ValueError) as excinfo:
        ca.get_adv_estimator_fn("invalid_name")
    assert "Unknown advantage estimator simply: invalid_name" in str(excinfo.value)
    assert "grpo" in str(excinfo.value)  # and it lists what is registered
    with pytest.raises(ValueError):
        ca.get_adv_estimator_fn("GAE")  # names are case-sensitive
    with pytest.raises(ValueError, match="Unsupported loss mode: Vanilla. Supported modes are: "):
        ca.get_policy_loss_fn("Vanilla")


def test_built_in_losses_keep_verls_signature_name_and_docs() -> None:
    import inspect

    standard = ["old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config",
                "rollout_is_weights"]
    defaults = {"gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean"}
    for name, fn in ca.POLICY_LOSS_REGISTRY.items():
        params = inspect.signature(fn).parameters
        assert list(params) == standard, name
        assert params["loss_agg_mode"].default == defaults.get(name, "token-mean"), name
        assert params["config"].default is None and params["rollout_is_weights"].default is None, name
        assert fn.__name__ == f"compute_policy_loss_{name}" and fn.__doc__, name
        assert fn.__module__.startswith("trainer_svc.algos.policy_loss_"), name
        assert getattr(ca, fn.__name__) is fn, name


def test_built_in_losses_refuse_mismatched_shapes() -> None:
    old, logp, adv, mask = torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3)
    for name, fn in ca.POLICY_LOSS_REGISTRY.items():
        with pytest.raises(ValueError, match=r"share one \[batch, response_length\] shape"):
            fn(old, logp, adv, torch.ones(2, 4), config={"clip_ratio": 0.2})
        with pytest.raises(ValueError, match="rollout_is_weights"):
            fn(old, logp, adv, mask, config={"clip_ratio": 0.2}, rollout_is_weights=torch.ones(3, 3))
