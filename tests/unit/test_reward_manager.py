"""RewardManager with the built-in scorers (in-process): layout of scores, extras, errors."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from reward_svc.decode import load_decoder, response_lengths
from reward_svc.manager import MalformedBatchError, RewardManager
from services.config.reward import RewardConfig
from tests.unit.reward_common import last_valid_index, make_group, write_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("reward_tok"))


@pytest.fixture(scope="module")
def manager(tok_dir):
    return RewardManager(RewardConfig(), load_decoder(tok_dir))


def test_scores_on_last_valid_token(manager, tok_dir):
    g = make_group(tok_dir, ["so 3+4 = 7\n#### 7", "#### 8", "I think #### 7 is it"], ["7", "7", "7"])
    out, rep = manager.score(g)
    tls = out.batch["token_level_scores"]
    assert tls.dtype == torch.float32 and tls.shape == g.batch["responses"].shape
    last = last_valid_index(g)
    assert tls[0, last[0]] == 1.0 and tls[1, last[1]] == 0.0 and tls[2, last[2]] == 1.0
    assert tls.sum().item() == 2.0  # zeros everywhere else
    assert rep.scores == [1.0, 0.0, 1.0] and rep.error_kinds == [None, None, None]
    assert list(out.non_tensor_batch["error"]) == ["", "", ""]
    assert list(out.non_tensor_batch["reward_extra_info"]) == [{}, {}, {}]


def test_padding_after_the_response_is_ignored(manager, tok_dir):
    g = make_group(tok_dir, ["#### 7"], ["7"])
    # write a misleading answer into the masked-out tail: it must not be decoded
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{tok_dir}/tokenizer.json")
    junk = tok.encode(" #### 9").ids
    n = int(response_lengths(g.batch)[0])
    g.batch["responses"][0, n : n + len(junk)] = torch.tensor(junk)
    out, _ = manager.score(g)
    assert out.batch["token_level_scores"].sum().item() == 1.0


def test_errors_recorded_per_sample(manager, tok_dir):
    g = make_group(tok_dir, ["#### 1", "#### 2", "#### 3"], ["1", "2", "3"], ["openai/gsm8k", "no/such", "openai/gsm8k"])
    g.non_tensor_batch["error"][2] = "rollout: truncated"
    g.non_tensor_batch["reward_model"][0] = {"style": "rule"}  # no ground truth
    out, rep = manager.score(g)
    err = list(out.non_tensor_batch["error"])
    assert err[0].startswith("reward invalid:") and "ground_truth" in err[0]
    assert err[1].startswith("reward exception:") and "no/such" in err[1]
    assert err[2] == "rollout: truncated"  # scorer fine: the rollout's error is kept
    assert rep.scores == [0.0, 0.0, 1.0]


def test_reward_kwargs_reach_builtin_scorers(tok_dir):
    cfg = RewardConfig(custom_reward_function={"reward_kwargs": {"method": "flexible"}})
    m = RewardManager(cfg, load_decoder(tok_dir))
    out, rep = m.score(make_group(tok_dir, ["the answer is 12"], ["12"]))
    assert rep.scores == [1.0]


def test_malformed_groups_fail_alone(manager, tok_dir):
    good = make_group(tok_dir, ["#### 5"], ["5"], uid="good")
    no_src = make_group(tok_dir, ["#### 5"], ["5"], uid="nosrc")
    no_src.non_tensor_batch.pop("data_source")
    no_resp = make_group(tok_dir, ["#### 5"], ["5"], uid="noresp")
    no_resp.batch = no_resp.batch.exclude("responses")
    bad_mask = make_group(tok_dir, ["#### 5"], ["5"], uid="badmask")
    bad_mask.batch = bad_mask.batch.exclude("attention_mask", "response_mask")
    bad_mask.batch["response_mask"] = torch.ones((1, 3), dtype=torch.int64)
    float_resp = make_group(tok_dir, ["#### 5"], ["5"], uid="float")
    float_resp.batch["responses"] = float_resp.batch["responses"].float()
    outs = manager.score_many([no_src, good, no_resp, bad_mask, float_resp])
    assert isinstance(outs[0], MalformedBatchError) and "data_source" in str(outs[0])
    assert isinstance(outs[2], MalformedBatchError) and "responses" in str(outs[2])
    assert isinstance(outs[3], MalformedBatchError) and "mask" in str(outs[3])
    assert isinstance(outs[4], MalformedBatchError) and "integer" in str(outs[4])
    data, rep = outs[1]
    assert rep.scores == [1.0] and data.batch["token_level_scores"].sum() == 1.0


def test_empty_response_does_not_crash(manager, tok_dir):
    g = make_group(tok_dir, ["#### 5"], ["5"])
    g.batch["attention_mask"][0, 4:] = 0
    out, rep = manager.score(g)
    assert rep.scores == [0.0] and out.batch["token_level_scores"].abs().sum() == 0


def test_many_groups_decoded_together(manager, tok_dir):
    groups = [make_group(tok_dir, [f"#### {i}", "#### x"], [str(i), str(i)], uid=f"g{i}") for i in range(5)]
    outs = manager.score_many(groups)
    assert [rep.scores for _, rep in outs] == [[1.0, 0.0]] * 5
    assert all(d.meta_info["group"] == f"g{i}" for i, (d, _) in enumerate(outs))


def test_config_is_strict_and_bounded():
    with pytest.raises(ValidationError, match="custom_reward_function.path"):
        RewardConfig(reward_manager="batch")
    with pytest.raises(ValidationError):
        RewardConfig(num_workers=0)
    with pytest.raises(ValidationError):
        RewardConfig(call_timeout_s=0)
    with pytest.raises(ValidationError):
        RewardConfig(memory_limt_mb=100)  # typo must fail
    with pytest.raises(ValidationError):
        RewardConfig(custom_reward_function={"path": "x.py", "name": "not a name"})
    ok = RewardConfig(custom_reward_function={"path": "x.py", "name": "f"}, reward_manager="batch")
    assert ok.custom_reward_function.name == "f"
    for name, f in RewardConfig.model_fields.items():
        assert f.description, name


def test_sandbox_needed_for_user_function(tok_dir):
    with pytest.raises(ValueError, match="SandboxPool"):
        RewardManager(RewardConfig(custom_reward_function={"path": "x.py"}), load_decoder(tok_dir))
