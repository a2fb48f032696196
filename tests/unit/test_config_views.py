"""One job spec, one typed view per service: no orphan keys, one home per key, one loader."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from meshrl_cli import main as cli_main
from services.config.job import JobSpec, JobSpecError, parse_job
from services.config.loader import MOVED_KEYS, ConfigError
from services.config.views import (
    CONTROLLER_ONLY, TAKES, VIEW_CLASSES, FeederView, RewardView, RolloutView, TrainerView, derive_view,
    derive_views, load_view, write_views,
)  # fmt: skip
from services.readiness import Ready, announce_ready, find_ready, parse_ready_line, ready_line
from tests.fixtures.specs import MINIMAL_SPEC

BASE = MINIMAL_SPEC


def _model_class(annotation: typing.Any) -> type[BaseModel] | None:
    """The pydantic model class of a field annotation (``X | None`` unwrapped), or None for a
    leaf (scalars, lists, dicts, and unions of several models such as ``queues``)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Annotated:
        return _model_class(args[0])
    if args and typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType")):
        return _model_class(args[0]) if len(args) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _leaves(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths (YAML names: aliases) of every leaf field of ``cls``."""
    out = []
    for name, field in cls.model_fields.items():
        key = prefix + (field.alias or name)
        sub = _model_class(field.annotation)
        out += _leaves(sub, key + ".") if sub is not None else [key]
    return out


def _has_path(cls: type[BaseModel], dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    for name, field in cls.model_fields.items():
        if (field.alias or name) == head:
            if not rest:
                return True
            sub = _model_class(field.annotation)
            return sub is not None and _has_path(sub, rest)
    return False


def test_every_job_key_reaches_a_service_view_or_is_controller_only():
    """Walk JobSpec: each leaf is taken (itself or a block holding it) into at least one
    view, or is listed in CONTROLLER_ONLY with a reason. A new key nobody reads fails here."""
    sources = [t.job for takes in TAKES.values() for t in takes] + ["services.trainer.metrics_port"]  # feeder's URL
    orphans = [
        leaf for leaf in _leaves(JobSpec)
        if leaf not in CONTROLLER_ONLY and not any(leaf == s or leaf.startswith(s + ".") for s in sources)
    ]  # fmt: skip
    assert orphans == [], f"job keys no service view reads: {orphans}"
    assert all(reason for reason in CONTROLLER_ONLY.values())
    for path in CONTROLLER_ONLY:
        assert _has_path(JobSpec, path), path


def test_the_table_names_real_keys_on_both_sides():
    for service, takes in TAKES.items():
        for t in takes:
            assert _has_path(JobSpec, t.job), f"{service}: job has no key {t.job}"
            assert _has_path(VIEW_CLASSES[service], t.view), f"{service} view has no key {t.view}"


def test_a_changed_job_value_reaches_its_view():
    """Not only declared: a value set in the job is the value each view carries."""
    job = parse_job(BASE, [
        "services.trainer.nproc=3", "services.trainer.device=cuda", "services.trainer.torch_threads=2",
        "services.rollout.device=cuda", "services.reward.device=cuda", "reward.reward_model.enable=true",
        "reward.reward_model.path=/rm", "services.host=10.0.0.5", "services.trainer.metrics_port=9103",
        "model.dtype=bfloat16", "rollout.dtype=float16", "async.max_staleness=3", "rollout.temperature=0.5",
        "data.max_prompt_length=77", "services.reward.grpc_port=null",
    ])  # fmt: skip
    v = derive_views(job)
    t, r, w, f = v["trainer"], v["rollout"], v["reward"], v["feeder"]
    assert (t.resources.nproc, t.resources.device, t.resources.torch_threads, t.resources.host) == (3, "cuda", 2, "10.0.0.5")
    assert (t.model.dtype, t.async_.max_staleness, t.rollout.temperature) == ("bfloat16", 3, 0.5)
    assert (r.resources.device, r.dtype, r.rollout.prompt_length, r.rollout.response_length) == ("cuda", "float16", 77, 512)
    assert (w.resources.device, w.resources.grpc_port, w.reward.tokenizer_path) == ("cuda", None, "/models/tiny")
    assert f.max_in_flight == 4 * 8 and f.trainer_metrics_url == "http://10.0.0.5:9103/metrics"
    assert not f.feed_each_step  # mode all: the feeder keeps its poll
    assert derive_views(parse_job(BASE, ["weights.rollout.mode=canary", "services.rollout.replicas=2"]))["feeder"].feed_each_step


def test_async_max_in_flight_sets_the_admission_bound_for_the_feeder_and_the_trainer():
    assert derive_views(parse_job(BASE, ["async.max_staleness=3"]))["feeder"].max_in_flight == 4 * 8
    v = derive_views(parse_job(BASE, ["async.max_staleness=3", "async.max_in_flight=12"]))
    assert v["feeder"].max_in_flight == 12
    assert v["trainer"].async_.max_in_flight_for(v["trainer"].data.train_batch_size) == 12  # the park limit's window
    with pytest.raises(Exception, match="a batch could never be admitted"):
        parse_job(BASE, ["async.max_in_flight=7"])  # below train_batch_size (8)
    with pytest.raises(Exception, match="could only go stale"):
        parse_job(BASE, ["async.max_staleness=1", "async.max_in_flight=17"])  # above (1 + 1) * 8


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_keys_with_another_home_are_refused_naming_it(old):
    with pytest.raises(JobSpecError) as exc:
        parse_job(BASE, [f"{old}=1"])
    assert f"{old}: not a key here" in str(exc.value) and MOVED_KEYS[old] in str(exc.value)


def test_trainer_nproc_and_device_are_refused_pointing_to_services(tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(BASE))
    res = subprocess.run([sys.executable, "-m", "meshrl_cli", "run", str(tmp_path / "job.yaml"),
                          "trainer.nproc=4", "trainer.device=cuda"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "trainer.nproc: not a key here (each setting has one home): set services.trainer.nproc instead" in res.stderr
    assert "trainer.device: not a key here (each setting has one home): set services.trainer.device instead" in res.stderr


def test_settings_the_job_would_ignore_are_errors():
    with pytest.raises(JobSpecError, match="model.dtype: float16 cannot be trained"):
        parse_job(BASE, ["model.dtype=float16"])
    assert parse_job(BASE, ["model.dtype=bfloat16", "rollout.dtype=float16"]).rollout.dtype == "float16"
    with pytest.raises(JobSpecError, match="services.reward.device: cuda is used only by a reward model"):
        parse_job(BASE, ["services.reward.device=cuda"])


def test_views_are_written_and_read_back_exactly(tmp_path):
    job = parse_job(BASE, ["queues.type=redis", "services.trainer.nproc=2"])
    paths = write_views(derive_views(job), tmp_path)
    assert sorted(paths) == ["feeder", "reward", "rollout", "trainer"]
    for name, cls in (("trainer", TrainerView), ("rollout", RolloutView), ("reward", RewardView), ("feeder", FeederView)):
        assert load_view(cls, paths[name]) == derive_view(job, name)
        assert yaml.safe_load(paths[name].read_text())["service"] == name
    with pytest.raises(ConfigError, match="is the rollout service's view, not the trainer service's"):
        load_view(TrainerView, paths["rollout"])
    assert load_view(TrainerView, paths["trainer"], ["resources.nproc=4"]).resources.nproc == 4


def test_meshrl_views_cli_with_overrides_anywhere(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(BASE))
    out = tmp_path / "views"
    assert cli_main(["views", "rollout.n=6", str(tmp_path / "job.yaml"), "--out", str(out), "services.trainer.nproc=2"]) == 0
    assert yaml.safe_load((out / "trainer.yaml").read_text())["resources"]["nproc"] == 2
    assert yaml.safe_load((out / "rollout.yaml").read_text())["rollout"]["n"] == 6
    capsys.readouterr()
    assert cli_main(["views", str(tmp_path / "job.yaml"), "--out", str(out), "rollout.nn=1"]) == 2
    assert "rollout.nn: unknown key" in capsys.readouterr().err


def test_unknown_words_are_still_errors(tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(BASE))
    with pytest.raises(SystemExit):
        cli_main(["validate", str(tmp_path / "job.yaml"), "--no-such-flag"])
    with pytest.raises(SystemExit):
        cli_main(["make-dataset", "arith", str(tmp_path / "d"), "rollout.n=2"])  # takes no overrides


def test_readiness_line_round_trip(capsys):
    announce_ready("rollout", "rollout-1", {"grpc": "127.0.0.1:5000", "metrics": "127.0.0.1:5001"}, device="cpu")
    line = capsys.readouterr().out
    r = parse_ready_line(line)
    assert isinstance(r, Ready) and (r.service, r.id, r.port("grpc"), r.info["device"]) == ("rollout", "rollout-1", 5000, "cpu")
    assert parse_ready_line("INFO something else") is None
    assert find_ready("noise\n" + ready_line("trainer", "t", {"metrics": "h:1"}) + "\nmore").service == "trainer"
    with pytest.raises(ValueError, match="malformed readiness line"):
        parse_ready_line("MESHRL_READY {not json")
    with pytest.raises(KeyError, match="announced no 'weights' address"):
        r.address("weights")


def test_job_spec_yaml_files_in_the_repository_are_valid():
    root = Path(__file__).resolve().parents[2]
    for path in [root / "examples" / "quickstart.yaml", root / "deploy" / "config" / "job.yaml"]:
        job = parse_job(yaml.safe_load(path.read_text()))
        derive_views(job)


def _other_value(value):
    """A different value of the same type (None when there is no obvious one)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if isinstance(value, str):
        return value + "x"
    return None


def test_every_changed_job_value_changes_some_view():
    """Perturb each leaf of a job one at a time: the change must show up in at least one
    view (the declaration in TAKES alone would not catch a view that drops the value)."""
    import json

    from services.config.views import _lookup

    base = parse_job(BASE)
    tree = base.model_dump(mode="json", by_alias=True)
    before = {k: v.model_dump(mode="json", by_alias=True) for k, v in derive_views(base).items()}
    tried, lost = 0, []
    for leaf in _leaves(JobSpec):
        if leaf in CONTROLLER_ONLY:
            continue
        alt = _other_value(_lookup(tree, leaf))
        if alt is None:
            continue
        try:
            job = parse_job(BASE, [f"{leaf}={json.dumps(alt) if isinstance(alt, str) else alt}"])
        except JobSpecError:
            continue  # the changed value is out of bounds or breaks a cross-block rule
        tried += 1
        after = {k: v.model_dump(mode="json", by_alias=True) for k, v in derive_views(job).items()}
        if after == before:
            lost.append(leaf)
    assert lost == [], f"job keys whose value reaches no view: {lost}"
    assert tried >= 140, tried  # most scalar keys were really exercised (142 when written)
