"""status.json progress is cleaned before it reaches the API."""

from __future__ import annotations

import math

from gateway_svc.launchers.local import clean_progress, read_status_file


def test_keeps_good_fields():
    info = {"step": 3, "total_steps": 10, "reward_mean": 0.5, "staleness": 1, "tokens_per_s": 12.5,
            "queues": {"prompts": 4}, "pid": 1234, "state": "running"}  # fmt: skip
    assert clean_progress(info) == {"step": 3, "total_steps": 10, "reward_mean": 0.5, "staleness": 1.0,
                                    "tokens_per_s": 12.5, "queues": {"prompts": 4}}  # fmt: skip


def test_drops_nan_wrong_types_and_negative_depths():
    info = {"step": True, "total_steps": "10", "reward_mean": math.nan, "staleness": math.inf,
            "tokens_per_s": None, "queues": {"a": -1, "b": "x", "c": 2.5}}  # fmt: skip
    assert clean_progress(info) == {}


def test_half_written_or_missing_status_file_is_empty(tmp_path):
    assert read_status_file(tmp_path) == {}
    (tmp_path / "status.json").write_text('{"step": 1')
    assert read_status_file(tmp_path) == {}
    (tmp_path / "status.json").write_text("[1, 2]")
    assert read_status_file(tmp_path) == {}
