"""The job spec: strict blocks, verl key names, overrides, clear errors."""

import pytest
import yaml

from meshrl_cli import main as cli_main
from services.config.job import JobSpecError, apply_overrides, dump_job, load_job, parse_job
from tests.fixtures.specs import MINIMAL_SPEC

BASE = MINIMAL_SPEC


def test_minimal_spec_gets_defaults_and_verl_names():
    spec = parse_job(BASE)
    assert spec.rollout.n == 4
    assert spec.algorithm.adv_estimator == "grpo"
    assert spec.data.train_files == ["/data/train.parquet"]
    assert spec.async_.max_staleness == 1
    assert spec.queues.type == "embedded"


def test_overrides_are_typed_yaml_values():
    spec = parse_job(BASE, ["actor.optim.lr=3e-5", "algorithm.norm_adv_by_std_in_grpo=false", "async.max_staleness=0"])
    assert spec.actor.optim.lr == pytest.approx(3e-5)
    assert spec.algorithm.norm_adv_by_std_in_grpo is False
    assert spec.async_.max_staleness == 0


def test_overrides_do_not_mutate_the_callers_mapping():
    parse_job(BASE, ["rollout.n=8"])
    assert BASE["rollout"]["n"] == 4


@pytest.mark.parametrize(
    "override,names",
    [
        ("actor.optim.lrr=1", "actor.optim.lrr: unknown key"),
        ("rollout.n=0", "rollout.n: Input should be greater than or equal to 1"),
        ("actor.ppo_mini_batch_size=16", "exceeds data.train_batch_size"),
        ("queues.type=kafka", "queues:"),
        ("name=Has_Capitals", "name: must be lowercase"),
        ("actor.loss_agg_mode=mean", "actor.loss_agg_mode"),
        ("async.max_staleness=-1", "async.max_staleness"),
    ],
)
def test_bad_specs_name_the_field(override, names):
    with pytest.raises(JobSpecError) as exc:
        parse_job(BASE, [override])
    assert names in str(exc.value)


def test_grpo_needs_a_group():
    with pytest.raises(JobSpecError, match="needs rollout.n >= 2"):
        parse_job(BASE, ["rollout.n=1"])


def test_override_syntax_errors():
    with pytest.raises(JobSpecError, match="KEY=VALUE"):
        apply_overrides({}, ["rollout.n"])
    with pytest.raises(JobSpecError, match="is a value, not a block"):
        apply_overrides({"a": 1}, ["a.b=2"])


def test_dump_round_trips(tmp_path):
    spec = parse_job(BASE, ["queues.type=redis"])
    path = tmp_path / "job.yaml"
    path.write_text(dump_job(spec))
    again = load_job(path)
    assert again == spec
    assert yaml.safe_load(path.read_text())["async"]["max_staleness"] == 1


def test_load_resolves_relative_paths(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"")
    raw = dict(BASE, data={"train_files": "data/train.parquet", "train_batch_size": 8})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    spec = load_job(tmp_path / "job.yaml")
    assert spec.data.train_files == [str((tmp_path / "data" / "train.parquet").resolve())]


def test_load_errors_are_clear(tmp_path):
    with pytest.raises(JobSpecError, match="does not exist"):
        load_job(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(JobSpecError, match="not valid YAML"):
        load_job(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(JobSpecError, match="mapping"):
        load_job(tmp_path / "list.yaml")


def _readable_inputs(tmp_path):
    """BASE with a model directory and a parquet file that exist and can be read."""
    from services.data.parquet import write_rows

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen2"}')
    write_rows([{"data_source": "meshrl/arith", "prompt": [{"role": "user", "content": "1+1="}],
                 "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {}}], tmp_path / "train.parquet")
    return {**BASE, "model": {"path": str(tmp_path / "model")},
            "data": {**BASE["data"], "train_files": str(tmp_path / "train.parquet")}}


def test_meshrl_validate_cli(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_readable_inputs(tmp_path)))
    assert cli_main(["validate", str(tmp_path / "job.yaml"), "rollout.n=8"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rollout"]["n"] == 8
    assert cli_main(["validate", str(tmp_path / "job.yaml"), "rollout.nn=8"]) == 2
    assert "rollout.nn: unknown key" in capsys.readouterr().err


def test_validate_warns_in_one_line_when_a_trainer_restart_would_lose_steps(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(_readable_inputs(tmp_path)))
    job = str(tmp_path / "job.yaml")
    assert cli_main(["validate", job, "trainer.save_freq=-1"]) == 0  # a warning, not a refusal
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"{job}: warning: trainer.save_freq: -1 checkpoints only at a stop or the end")
    assert "services.restart.max_restarts=3" in line and "loses the steps trained since its last checkpoint" in line
    assert cli_main(["validate", job, "trainer.save_freq=0"]) == 0
    assert "warning: trainer.save_freq: 0" in capsys.readouterr().err
    # checkpoints every N steps (acks follow them), or no restarts at all: nothing to warn about
    for ok in (["trainer.save_freq=5"], ["trainer.save_freq=-1", "services.restart.max_restarts=0"]):
        assert cli_main(["validate", job, *ok]) == 0
        assert capsys.readouterr().err == "", ok


def test_validate_refuses_missing_model_and_corrupt_data_with_one_line_each(tmp_path, capsys):
    spec = _readable_inputs(tmp_path)
    (tmp_path / "train.parquet").write_bytes((tmp_path / "train.parquet").read_bytes()[:-40] + b"\0" * 40)
    spec["model"] = {"path": str(tmp_path / "no-such-model")}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    assert cli_main(["validate", str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert "model.path:" in err[0] and "does not exist" in err[0]
    assert "data.train_files[0]:" in err[1] and "not a readable parquet file" in err[1]


def test_validate_refuses_a_parquet_file_whose_pages_are_corrupt(tmp_path, capsys):
    spec = _readable_inputs(tmp_path)
    raw = bytearray((tmp_path / "train.parquet").read_bytes())
    for i in range(8, 60):  # inside the first column chunk, footer intact
        raw[i] ^= 0xFF
    (tmp_path / "train.parquet").write_bytes(bytes(raw))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    assert cli_main(["validate", str(tmp_path / "job.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.train_files[0]:" in err[0], err


def test_services_cpus_is_a_cpu_list():
    from services.placement import parse_cpu_list

    assert parse_cpu_list("0") == [0] and parse_cpu_list("0,2-3") == [0, 2, 3] and parse_cpu_list("3,1") == [1, 3]
    job = parse_job(BASE, ["services.trainer.cpus=0", "services.rollout.cpus=1-3"])
    assert (job.services.trainer.cpus, job.services.rollout.cpus, job.services.reward.cpus) == ("0", "1-3", None)
    for bad in ("", "a", "3-1", "1,", "-1"):
        with pytest.raises(JobSpecError, match="services.trainer.cpus"):
            parse_job(BASE, [f"services.trainer.cpus={bad}"])
