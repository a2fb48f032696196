"""Spec validation at the gateway: good specs resolve, bad ones name the field."""

from __future__ import annotations

import pytest
import yaml

from gateway_svc.spec_validation import MAX_SPEC_BYTES, SpecRejected, validate_spec
from tests.integration.gateway_support import VALID_SPEC, VALID_SPEC_YAML


def test_yaml_and_mapping_give_the_same_resolved_spec():
    a = validate_spec(VALID_SPEC_YAML)
    b = validate_spec(dict(VALID_SPEC))
    assert a == b and a.name == "arith-test"
    assert yaml.safe_load(a.resolved_yaml)["data"]["train_batch_size"] == 4


def test_overrides_apply():
    got = validate_spec(VALID_SPEC_YAML, ["rollout.n=8", "data.max_prompt_length=64"])
    resolved = yaml.safe_load(got.resolved_yaml)
    assert resolved["rollout"]["n"] == 8 and resolved["data"]["max_prompt_length"] == 64


@pytest.mark.parametrize(
    "spec, overrides, field",
    [
        ({**VALID_SPEC, "name": "Bad Name"}, [], "name"),
        ({**VALID_SPEC, "data": {**VALID_SPEC["data"], "train_batch_size": 0}}, [], "data.train_batch_size"),
        ({**VALID_SPEC, "rolout": {"n": 2}}, [], "rolout"),
        (VALID_SPEC, ["rollout.temperature=hot"], "rollout.temperature"),
        (VALID_SPEC, ["no-equals-sign"], "no-equals-sign"),
    ],
)
def test_bad_specs_name_the_field(spec, overrides, field):
    with pytest.raises(SpecRejected) as err:
        validate_spec(dict(spec), overrides)
    assert field in str(err.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string", "", "a: [unclosed", "{{{"])
def test_non_mapping_or_broken_yaml_is_refused(text):
    with pytest.raises(SpecRejected, match="spec"):
        validate_spec(text)


def test_huge_spec_is_refused():
    with pytest.raises(SpecRejected, match="larger than"):
        validate_spec("a: " + "x" * (MAX_SPEC_BYTES + 1))


def test_yaml_alias_bomb_is_refused_quickly():
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    lines.append("name: bomb\ndata: {train_files: *a9, train_batch_size: 4}")
    with pytest.raises(SpecRejected, match="aliases"):
        validate_spec("\n".join(lines))
