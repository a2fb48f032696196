"""``meshrl validate --schema`` / ``meshrl config``: every key with type, default, description."""

from __future__ import annotations

import subprocess
import sys

from services.config.job import JobSpec
from services.config.schema_doc import format_schema, schema_rows


def test_every_key_is_listed_with_type_default_and_description():
    spec = JobSpec
    rows = {r.key: r for r in schema_rows(spec)}
    for name, field in spec.model_fields.items():
        assert (field.alias or name) in rows
    assert rows["trainer.test_freq"].type == "int" and rows["trainer.test_freq"].default == "-1"
    assert rows["trainer.logger"].default == '["console"]'
    assert rows["data.train_files"].default == "(required)"
    assert rows["data.truncation"].type == '"error"|"left"|"right"|"middle"'
    assert rows["rollout.val_kwargs.temperature"].default == "0.0"  # the block's own default, not the class's
    assert rows["rollout.temperature"].default == "1.0"
    assert "queues.url [type=redis]" in rows  # each variant of a union block, named
    assert "rollout.multi_turn.tools[].class_name" in rows
    missing = [k for k, r in rows.items() if not r.description]
    assert missing == [], f"keys without a description: {missing}"


def test_cli_prints_the_schema():
    out = subprocess.run([sys.executable, "-m", "meshrl_cli", "validate", "--schema"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == format_schema(JobSpec)
    grep = subprocess.run([sys.executable, "-m", "meshrl_cli", "config", "--grep", "val_kwargs"], capture_output=True,
                          text=True, timeout=120)
    lines = grep.stdout.splitlines()
    assert grep.returncode == 0 and lines[0].startswith("rollout.val_kwargs ") and len(lines) == 6


def test_unknown_keys_get_a_did_you_mean():
    from pathlib import Path

    import pytest

    from services.config.job import JobSpecError, load_job

    spec = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    with pytest.raises(JobSpecError) as info:
        load_job(spec, ["trainer.test_freg=3", "queues.adress=x", "rollout.val_kwargs.temprature=1", "zzz.q=1"])
    text = str(info.value)
    assert "trainer.test_freg: unknown key (did you mean 'test_freq'?; `meshrl config` lists every key)" in text
    assert "did you mean 'address'?" in text and "did you mean 'temperature'?" in text
    assert "zzz: unknown key (`meshrl config` lists every key)" in text
