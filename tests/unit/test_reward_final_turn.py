"""``reward.solution_str: final_turn``: scorers read only a trajectory's last model turn.

Multi-turn groups are built as the agent loop packs them (docs/agent.md): the response is
model turn, observation, model turn, ... with ``response_mask`` 1 on model tokens and 0 on
observation tokens, all attended. The observation text below is the one the example's
calculator returns, rendered by the tiny model's chat template.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from reward_svc.decode import final_turn_spans, load_decoder, response_lengths
from reward_svc.manager import RewardManager
from services.config.reward import RewardConfig
from services.protocol import DataProto
from tests.unit.reward_common import make_group, write_tokenizer

CALL = '<tool_call>{"name":"calc","arguments":{"expr":"47*28"}}</tool_call><|im_end|>'
OBS = "\n<|im_start|>user\n<tool_response>\n1316\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("final_turn_tok"))


def _multi_turn_group(tok_dir: str, trajectories: list[list[tuple[str, int]]], truths: list[str], resp_len: int = 160):
    """A group whose responses are (text, is_model) segments, padded to ``resp_len``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
    pad = tok.token_to_id("<|endoftext|>")
    b, p = len(trajectories), 4
    responses = torch.full((b, resp_len), pad, dtype=torch.int64)
    rmask = torch.zeros((b, resp_len), dtype=torch.int64)
    attn = torch.zeros((b, p + resp_len), dtype=torch.int64)
    attn[:, p - 2 : p] = 1
    for i, segments in enumerate(trajectories):
        ids: list[int] = []
        mask: list[int] = []
        for text, is_model in segments:
            seg = tok.encode(text, add_special_tokens=False).ids
            ids += seg
            mask += [is_model] * len(seg)
        assert len(ids) <= resp_len
        responses[i, : len(ids)] = torch.tensor(ids)
        rmask[i, : len(ids)] = torch.tensor(mask)
        attn[i, p : p + len(ids)] = 1
    prompts = torch.full((b, p), pad, dtype=torch.int64)
    nt = {
        "data_source": np.array(["meshrl/arith"] * b, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": g} for g in truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(b)], dtype=object),
        "uid": np.array(["g0"] * b, dtype=object),
        "sample_id": np.array([f"g0/{i}" for i in range(b)], dtype=object),
        "error": np.array([""] * b, dtype=object),
    }
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": rmask,
                 "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attn},
        non_tensors=nt, meta_info={"group": "g0"},
    )


def _trajectories():
    return [
        [(CALL, 1), (OBS, 0), ("The answer is done.<|im_end|>", 1)],  # answer turn without a number
        [(CALL, 1), (OBS, 0), ("1316<|im_end|>", 1)],                 # right number in the final turn
        [(CALL, 1), (OBS, 0), ("1317<|im_end|>", 1)],                 # right number only in the observation
        [(CALL, 1), (OBS, 0)],                                        # no answer turn at all
        [("1316<|im_end|>", 1)],                                      # answered without the tool
    ]


def _scores(tok_dir: str, solution_str: str) -> list[float]:
    mgr = RewardManager(RewardConfig(solution_str=solution_str), load_decoder(tok_dir))
    out, rep = mgr.score(_multi_turn_group(tok_dir, _trajectories(), ["1316"] * 5))
    assert rep.error_kinds == [None] * 5
    return rep.scores


def test_final_turn_scores_only_the_models_answer(tok_dir):
    assert _scores(tok_dir, "final_turn") == [0.0, 1.0, 0.0, 0.0, 1.0]


def test_whole_response_also_reads_the_observation(tok_dir):
    """The default (verl's): the observation's number rewards a turn that never answered."""
    assert _scores(tok_dir, "response") == [1.0, 1.0, 0.0, 1.0, 1.0]


def test_final_turn_spans(tok_dir):
    g = _multi_turn_group(tok_dir, _trajectories(), ["1316"] * 5)
    lengths = response_lengths(g.batch)
    start, end = (t.tolist() for t in final_turn_spans(g.batch, lengths))
    mask = g.batch["response_mask"]
    model = [int(mask[i, : int(lengths[i])].sum()) for i in range(5)]
    n_call = model[3]  # sample 3 is the call and the observation
    for i in (0, 1, 2):  # after call + observation, to the end
        assert start[i] == int(lengths[3]) and end[i] == int(lengths[i]) and end[i] - start[i] == model[i] - n_call
    assert (start[3], end[3]) == (0, n_call)  # ends on an observation: the call is the last model turn
    assert (start[4], end[4]) == (0, int(lengths[4]))  # one turn: the whole response
    g.batch["response_mask"][0].zero_()  # no model token: an empty final turn
    s0, e0 = (int(t[0]) for t in final_turn_spans(g.batch, lengths))
    assert s0 == e0 == int(lengths[0])
    del g.batch["response_mask"]  # no mask: the whole response
    s, e = final_turn_spans(g.batch, lengths)
    assert s.tolist() == [0] * 5 and e.tolist() == lengths.tolist()


def test_single_turn_groups_are_unchanged(tok_dir):
    texts = ["so 3+4 = 7\n#### 7", "#### 8", "I think #### 7 is it"]
    for sol in ("response", "final_turn"):
        mgr = RewardManager(RewardConfig(solution_str=sol), load_decoder(tok_dir))
        _, rep = mgr.score(make_group(tok_dir, texts, ["7"] * 3))
        assert rep.scores == [1.0, 0.0, 1.0]


def test_bad_solution_str_is_rejected():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="solution_str"):
        RewardConfig(solution_str="last_turn")
