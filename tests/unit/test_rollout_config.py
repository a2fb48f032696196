"""RolloutConfig, the rollout view, weight staging, and the entrypoint's argument parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rollout_svc.weight_check import VersionCheck, WeightManifest, WeightUpdateError, write_checked_file
from services.config.loader import ConfigError
from services.config.views import RolloutView, load_view
from services.config.rollout import RolloutConfig


def test_defaults_and_val_kwargs() -> None:
    c = RolloutConfig(n=8, temperature=0.7)
    assert c.sampling_for(False).n == 8 and c.sampling_for(False).temperature == 0.7
    v = c.sampling_for(True)
    assert v.n == 1 and not v.do_sample and v.temperature == 0.0
    assert c.on_weight_update == "finish"


@pytest.mark.parametrize(
    "bad",
    [{"n": 0}, {"top_p": 0.0}, {"top_k": -2}, {"temperature": -1}, {"on_weight_update": "drop"},
     {"gpu_memory_utilization": 1.5}, {"tempurature": 1.0},
     {"prompt_length": 100, "response_length": 100, "max_model_len": 150}],
)
def test_bad_values_fail_loudly(bad: dict) -> None:
    with pytest.raises(ValidationError):
        RolloutConfig(**bad)


def test_rollout_view_overrides_and_strictness(tmp_path: Path) -> None:
    f = tmp_path / "rollout.yaml"
    f.write_text("model: {path: /m}\nrollout: {n: 2, prompt_length: 64, response_length: 32}\n")
    v = load_view(RolloutView, f, ["rollout.n=5", "rollout.top_p=0.9"])
    assert (v.rollout.prompt_length, v.rollout.response_length, v.rollout.n, v.rollout.top_p) == (64, 32, 5, 0.9)
    assert v.model.path == "/m" and v.queues is None and v.weights is None and v.dtype == "float32"
    with pytest.raises(ConfigError, match="rollout.nn"):
        load_view(RolloutView, f, ["rollout.nn=2"])
    with pytest.raises(ConfigError, match="rollout.prompt_length is required"):
        load_view(RolloutView, f, ["rollout.prompt_length=null"])
    with pytest.raises(ConfigError, match="set services.rollout.grpc_port instead"):
        load_view(RolloutView, f, ["rollout.grpc_port=1"])
    v3 = load_view(RolloutView, f, ["queues.type=redis", "queues.url=redis://127.0.0.1:1", "rollout.dtype=float16"])
    assert v3.queues.type == "redis" and v3.dtype == "float16"


def test_load_view_reports_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_view(RolloutView, tmp_path / "nope.yaml")


def test_entrypoint_help_is_light_and_bad_config_exits_2(tmp_path: Path) -> None:
    code = "import sys, runpy; sys.argv = ['x', '--help']\ntry:\n runpy.run_module('rollout_svc', run_name='__main__')\n" \
           "except SystemExit: pass\nprint('torch' in sys.modules, 'vllm' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split()[-2:] == ["False", "False"], r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {path: /m}\nrollout: {n: -1, prompt_length: 8, response_length: 4}\n")
    r = subprocess.run([sys.executable, "-m", "rollout_svc", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "rollout.n:" in r.stderr


def _manifest() -> WeightManifest:
    return WeightManifest(shapes={"a.weight": (2, 3), "model.embed_tokens.weight": (4, 2), "lm_head.weight": (4, 2)},
                          optional=frozenset({"lm_head.weight"}))


def test_local_loads_are_checked_whole_before_writing(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    m = _manifest()
    good = [("a.weight", torch.ones(2, 3, dtype=torch.float64)), ("model.embed_tokens.weight", torch.zeros(4, 2))]
    p = tmp_path / "w.safetensors"
    assert write_checked_file(iter(good), str(p), m, "float32")["tensors"] == 2
    back = load_file(str(p))
    assert back["a.weight"].dtype == torch.float32 and back["a.weight"].sum() == 6
    cases = [
        ([("nope", torch.zeros(1))], "unknown tensor"),
        ([("a.weight", torch.zeros(3, 2))], "shape"),
        ([("a.weight", torch.zeros(2, 3))], "lacks 1 tensors"),
        ([("a.weight", torch.full((2, 3), float("nan"))), good[1]], "NaN"),
        ([good[0], good[0]], "twice"),
        ([("a.weight", torch.zeros(2, 3, dtype=torch.int64)), good[1]], "non-float"),
        ([], "empty"),
        (["junk"], "pairs"),
    ]
    for items, msg in cases:
        q = tmp_path / f"bad-{msg[:4]}.safetensors"
        with pytest.raises(WeightUpdateError, match=msg):
            write_checked_file(iter(items), str(q), m, "float32")
        assert not q.exists()
        # the streaming check (the weight channel's path) refuses the same things
        with pytest.raises(WeightUpdateError, match=msg):
            check = VersionCheck(m)
            for item in items:
                check.check(item)
            check.finish()


def test_manifest_from_tiny_model(tiny_model: str) -> None:
    m = WeightManifest.from_model(tiny_model, tied=True)
    assert m is not None and m.shapes["model.embed_tokens.weight"][1] == 128
    assert "lm_head.weight" in m.optional
    assert WeightManifest.from_model("Qwen/Qwen2.5-0.5B", tied=False) is None


def test_rate_tracker_window_and_idle() -> None:
    from rollout_svc.replica import RateTracker

    r = RateTracker(window_s=10.0)
    assert r.rate(now=0.0) == 0.0
    r.add(0, now=0.0)
    r.add(500, now=5.0)
    assert r.rate(now=5.0) == pytest.approx(100.0)
    assert r.rate(now=10.0) == pytest.approx(50.0)  # no new tokens since t=5
    assert r.rate(now=100.0) == 0.0  # idle longer than the window


def test_stream_id_age(monkeypatch) -> None:
    from types import SimpleNamespace

    from rollout_svc import replica
    from rollout_svc.replica import _stream_id_age_s

    monkeypatch.setattr(replica, "time", SimpleNamespace(time=lambda: 1_000_000.0))  # the clock, fixed
    assert _stream_id_age_s("999998000-0") == 2.0  # "<ms>-<seq>": made 2000 ms before now
    assert _stream_id_age_s("999998500-17") == 1.5
    assert _stream_id_age_s("1000005000-0") == 0.0  # from a clock ahead of this one: not negative
    assert _stream_id_age_s("abc") is None and _stream_id_age_s("12-x") is None


def test_load_view_resolves_relative_model_dir(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    f = tmp_path / "rollout.yaml"
    f.write_text("model: {path: models/m, tokenizer_path: Qwen/Qwen2.5-0.5B}\nrollout: {prompt_length: 8, response_length: 4}\n")
    v = load_view(RolloutView, f)
    assert v.model.path == str((tmp_path / "models" / "m").resolve())
    assert v.model.tokenizer_path == "Qwen/Qwen2.5-0.5B"  # not a local path: kept (a hub id)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_finite_check_finds_one_bad_element_anywhere(dtype) -> None:
    from rollout_svc.weight_check import all_finite

    big = torch.finfo(dtype).max
    ok = torch.full((3, 1001), big, dtype=dtype)  # finite, though their sum overflows
    ok[1] = -big
    assert all_finite(ok) and all_finite(torch.empty(0, dtype=dtype))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for pos in ((0, 0), (1, 500), (2, 1000)):
            t = torch.randn(3, 1001).to(dtype)
            t[pos] = bad
            assert not all_finite(t), (bad, pos)
            assert not all_finite(t.t()) and not all_finite(t[:, pos[1]:pos[1] + 1])  # strided views too
    t = torch.randn(1000).to(dtype)
    t[10], t[20] = float("inf"), float("nan")
    assert not all_finite(t)
