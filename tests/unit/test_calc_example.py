"""The tool-use example's preparation (meshrl_cli/calc_example.py): a compact call the
Hermes parser accepts, one transcript layout, and a warm start that stops at its target."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_svc.agent.parsers import HermesParser
from meshrl_cli.calc_example import CALL_TOKENS, calc_rows, call_text, transcript_examples
from services.modelling.tiny import TinyModelSpec, build_tiny_model

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1)


@pytest.fixture(scope="module")
def calc_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("calc") / "model", TinyModelSpec(added_tokens=CALL_TOKENS, **SMALL))


def test_call_is_ten_tokens_and_parses(calc_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(calc_model)
    ids = tok.encode(call_text("47*28"), add_special_tokens=False)
    assert [tok.decode([i]) for i in ids] == [CALL_TOKENS[0], CALL_TOKENS[1], "4", "7", "*", "2", "8",
                                             CALL_TOKENS[2], CALL_TOKENS[3]]
    # the replica decodes a turn with skip_special_tokens=True: the call's tokens must survive
    text = tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True)
    assert text == call_text("47*28")
    parsed = HermesParser().parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calc", {"expr": "47*28"})] and not parsed.errors


def test_default_tiny_model_has_no_call_tokens(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m", TinyModelSpec(**SMALL)))
    assert len(tok.encode(call_text("47*28"), add_special_tokens=False)) > 40


def test_every_transcript_has_one_layout(calc_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(calc_model)
    rows = calc_rows(300, seed=3)
    assert all(32 <= r["extra_info"]["a"] <= 99 and 1000 <= int(r["reward_model"]["ground_truth"]) for r in rows)
    calls, answers = transcript_examples(rows, tok)
    assert {(len(ids), n) for ids, n in calls} == {(32, 22)}
    assert len({(len(ids), n) for ids, n in answers}) == 1
    ids, n = answers[0]
    truth = rows[0]["reward_model"]["ground_truth"]
    assert tok.decode(ids[n:], skip_special_tokens=True) == truth


def test_warm_start_stops_when_told(calc_model: Path, tmp_path: Path) -> None:
    from trainer_svc.warmstart import warm_start

    examples = [([1, 2, 3, 4, 5, 6], 2)] * 4
    checked = []

    def stop(model, step):
        checked.append(step)
        return step >= 6

    res = warm_start(calc_model, [], tmp_path / "warm", steps=50, batch_size=2, examples=examples, log_every=0,
                     stop_when=stop, check_every=3)
    assert checked == [3, 6] and res.steps == 6
    assert (tmp_path / "warm" / "model.safetensors").exists()
    full = warm_start(calc_model, [], tmp_path / "warm2", steps=4, batch_size=2, examples=examples, log_every=0)
    assert full.steps == 4  # without stop_when every step runs


def test_data_only_prompts_describe_a_call_the_hermes_parser_reads(tmp_path: Path) -> None:
    import re

    from meshrl_cli.calc_example import TOOL_SYSTEM, main
    from services.data.files import read_rows

    assert main(["--data-only", "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path / "data" / "train.parquet")
    assert len(rows) == 400 and len(read_rows(tmp_path / "data" / "test.parquet")) == 64
    system, user = rows[0]["prompt"]
    assert system == {"role": "system", "content": TOOL_SYSTEM}
    a, b = rows[0]["extra_info"]["a"], rows[0]["extra_info"]["b"]
    assert user["content"] == f"What is {a}*{b}?" and rows[0]["reward_model"]["ground_truth"] == str(a * b)
    # the call the message shows, with the question's expression in it, is a call the replica runs
    shown = re.search(r"<tool_call>.*</tool_call>", TOOL_SYSTEM).group(0).replace("<expression>", f"{a}*{b}")
    parsed = HermesParser().parse(shown)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calc", {"expr": f"{a}*{b}"})] and not parsed.errors
