"""Prompt files in every supported layout, the GSM8K/MATH converters and the chat template
key (real pyarrow, real ``datasets`` save_to_disk directories, the tiny model's tokenizer)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.data import synthetic
from services.data.convert import convert_file, gsm8k_answer, last_boxed
from services.data.files import DataFileError, read_rows
from services.data.parquet import write_rows
from services.data.prompts import PromptDataset

GSM8K = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"},
    {"question": "A shop sold 1,200 apples and 300 more. How many?", "answer": "1200+300=1500\n#### 1,500"},
]
MATH = [
    {"problem": "What is $1/2 + 0$?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1",
     "type": "Algebra"},
    {"problem": "Compute $2+3$.", "solution": "First \\boxed{4}? No: $2+3=\\boxed{5}$.", "level": "Level 1",
     "type": "Prealgebra"},
]


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_every_format_reads_the_same_rows(tmp_path):
    import datasets

    rows = synthetic.arith_rows(6, seed=2)
    write_rows(rows, tmp_path / "a.parquet")
    _jsonl(tmp_path / "a.jsonl", rows)
    (tmp_path / "a.json").write_text(json.dumps(rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for src in ("a.parquet", "a.jsonl", "a.json", "saved"):
        assert read_rows(tmp_path / src) == rows, src
    assert read_rows([tmp_path / "a.jsonl", tmp_path / "saved"]) == rows + rows


def test_saved_dataset_view_and_dict(tmp_path):
    import datasets

    rows = synthetic.arith_rows(10, seed=1)
    ds = datasets.Dataset.from_list(rows)
    picked = ds.select([7, 2, 5])
    picked.save_to_disk(str(tmp_path / "picked"))
    assert read_rows(tmp_path / "picked") == [rows[7], rows[2], rows[5]]
    datasets.DatasetDict({"train": ds, "test": picked}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataFileError, match="DatasetDict; give one split"):
        read_rows(tmp_path / "dict")
    assert read_rows(tmp_path / "dict" / "test") == [rows[7], rows[2], rows[5]]


@pytest.mark.parametrize("name,content,match", [
    ("x.csv", "a,b\n", "unknown format .csv"),
    ("bad.jsonl", '{"data_source": 1}\nnot json\n', r"bad.jsonl:2: not valid JSON"),
    ("cols.jsonl", '{"question": "q", "answer": "#### 1"}\n', r"lacks required column\(s\) \['data_source'"),
])
def test_bad_files_name_the_problem(tmp_path, name, content, match):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataFileError, match=match):
        read_rows(tmp_path / name)
    with pytest.raises(DataFileError, match="not a datasets save_to_disk directory"):
        read_rows(tmp_path)


def test_answer_extraction():
    assert gsm8k_answer("so\n#### 1,234") == "1234"
    assert last_boxed("a \\boxed{x} then \\boxed{\\frac{a}{b^{2}}} end") == "\\frac{a}{b^{2}}"
    for bad in ("no box", "\\boxed{unclosed"):
        with pytest.raises(ValueError):
            last_boxed(bad)


def test_gsm8k_and_math_convert_and_score_with_the_builtin_scorers(tmp_path):
    import datasets

    from reward_svc.scorers import default_compute_score

    rows = convert_file("gsm8k", _jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K), "train")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "1500"]
    assert rows[0]["prompt"][0]["content"].startswith("Natalia sold") and rows[0]["extra_info"]["index"] == 0
    assert default_compute_score(rows[0]["data_source"], "48+24=72\n#### 72", rows[0]["reward_model"]["ground_truth"]) == 1.0
    assert default_compute_score(rows[0]["data_source"], "#### 71", rows[0]["reward_model"]["ground_truth"]) == 0.0

    datasets.Dataset.from_list(MATH).save_to_disk(str(tmp_path / "math_test"))
    rows = convert_file("math", tmp_path / "math_test", "test")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{1}{2}", "5"]
    assert rows[1]["extra_info"] == {"split": "test", "index": 1, "level": "Level 1", "type": "Prealgebra"}
    assert default_compute_score(rows[0]["data_source"], "so \\boxed{1/2}", rows[0]["reward_model"]["ground_truth"]) == 1.0

    _jsonl(tmp_path / "broken.jsonl", [GSM8K[0], {"question": "q", "answer": "no marker"}])
    with pytest.raises(DataFileError, match="record 1 is not in the gsm8k layout: no '#### <answer>' line"):
        convert_file("gsm8k", tmp_path / "broken.jsonl", "train")


def _meshrl(*args):
    return subprocess.run([sys.executable, "-m", "meshrl_cli", *args], capture_output=True, text=True, timeout=120)


def test_make_dataset_cli_converts_local_files(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    _jsonl(tmp_path / "train.jsonl", GSM8K)
    _jsonl(tmp_path / "test.jsonl", GSM8K[:1])
    r = _meshrl("make-dataset", "gsm8k", str(tmp_path / "out"), "--from", str(tmp_path / "train.jsonl"),
                "--from", str(tmp_path / "test.jsonl"))
    assert r.returncode == 0, r.stderr
    assert len(read_rows(tmp_path / "out" / "train.parquet")) == 2 and len(read_rows(tmp_path / "out" / "test.parquet")) == 1
    ds = PromptDataset(tmp_path / "out" / "train.parquet", AutoTokenizer.from_pretrained(tiny_model), max_prompt_length=512)
    assert len(ds) == 2 and ds[0]["reward_model"]["ground_truth"] == "72"

    r = _meshrl("make-dataset", "math", str(tmp_path / "m"))
    assert r.returncode == 2 and "--from" in r.stderr and "Traceback" not in r.stderr
    r = _meshrl("make-dataset", "math", str(tmp_path / "m"), "--from", str(tmp_path / "train.jsonl"))
    assert r.returncode == 2 and "not in the math layout" in r.stderr and "Traceback" not in r.stderr


def test_chat_template_is_the_models_own_unless_given(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = synthetic.arith_rows(3, seed=0)
    rows[1]["prompt"] = "5+5="  # a plain string is one user message
    _jsonl(tmp_path / "p.jsonl", rows)
    own = PromptDataset(tmp_path / "p.jsonl", tok)
    assert tok.decode(own[1]["raw_prompt_ids"]) == "<|im_start|>user\n5+5=<|im_end|>\n<|im_start|>assistant\n"
    text = "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:"
    given = PromptDataset(tmp_path / "p.jsonl", tok, chat_template=text)
    assert tok.decode(given[1]["raw_prompt_ids"]) == "Q: 5+5=\nA:"
    (tmp_path / "t.jinja").write_text(text)
    from_file = PromptDataset(tmp_path / "p.jsonl", tok, chat_template=str(tmp_path / "t.jinja"))
    assert [from_file[i]["raw_prompt_ids"] for i in range(3)] == [given[i]["raw_prompt_ids"] for i in range(3)]
    with pytest.raises(ValueError, match="no such file"):
        PromptDataset(tmp_path / "p.jsonl", tok, chat_template=str(tmp_path / "missing.jinja"))
