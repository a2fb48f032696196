"""``trainer.logger`` backends, each read back with the real library's own reader:
TensorBoard's event accumulator, the wandb offline run file (wandb's protobuf records),
MLflow's tracking client on the local store."""

from __future__ import annotations

import json
import math
import struct

import pytest

from controller_svc.tracking import make_loggers

STEPS = {1: {"critic/score/mean": 0.25, "actor/loss": -0.5, "val/test_score/meshrl/arith/mean@4": 0.5},
         2: {"critic/score/mean": 0.75, "actor/loss": 0.125, "timing/ignored_text": "n/a"},
         3: {"critic/score/mean": 1.0, "actor/loss": float("nan"), "val/test_score/meshrl/arith/mean@4": 1.0}}


def _run(tmp_path, names, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    lg = make_loggers(names, run_dir=tmp_path, project="meshrl-test", experiment="exp-1",
                      config={"data": {"train_batch_size": 8}, "trainer": {"logger": names}})
    for step, m in STEPS.items():
        lg.log(m, step)
    lg.close()


def test_console_and_jsonl(tmp_path, monkeypatch, capsys):
    _run(tmp_path, ["console", "jsonl"], monkeypatch)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 1: critic/score/mean=0.25 actor/loss=-0.5 val/test_score/meshrl/arith/mean@4=0.5"
    assert len(out) == 3 and "timing/ignored_text" not in out[1]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["metrics"] == STEPS[1] and rows[2]["metrics"]["actor/loss"] is None  # NaN is not JSON


def test_tensorboard_event_files(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(tmp_path, ["tensorboard"], monkeypatch)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"critic/score/mean", "actor/loss", "val/test_score/meshrl/arith/mean@4"}
    assert [(e.step, e.value) for e in acc.Scalars("critic/score/mean")] == [(1, 0.25), (2, 0.75), (3, 1.0)]
    assert [e.step for e in acc.Scalars("val/test_score/meshrl/arith/mean@4")] == [1, 3]
    assert math.isnan(acc.Scalars("actor/loss")[-1].value)


def _wandb_records(path):
    """Records of a wandb run file: a LevelDB-style log (32 KiB blocks, 7-byte record
    headers, ':W&B' file header), each record one of wandb's own protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            chunks.append(buf + chunk)
        else:
            break
    for c in chunks:
        rec = pb.Record()
        rec.ParseFromString(c)
        yield rec


def test_wandb_offline_run_files(tmp_path, monkeypatch):
    _run(tmp_path, ["wandb"], monkeypatch)
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    history, run = [], None
    recs = list(_wandb_records(runs[0]))
    kinds = [r.WhichOneof("record_type") for r in recs]
    assert "run" in kinds and kinds[-1] == "exit", kinds  # the whole run is on file once close() returns
    for rec in recs:
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item})
        elif kind == "run":
            run = rec.run
    assert run.project == "meshrl-test" and run.display_name == "exp-1"
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["data"] == {"train_batch_size": 8}
    assert [h["_step"] for h in history] == [1, 2, 3]
    assert [h["critic/score/mean"] for h in history] == [0.25, 0.75, 1.0]
    assert history[0]["val/test_score/meshrl/arith/mean@4"] == 0.5 and "val/test_score/meshrl/arith/mean@4" not in history[1]


def test_mlflow_local_store(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    _run(tmp_path, ["mlflow"], monkeypatch)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.get_experiment_by_name("meshrl-test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "exp-1" and run.info.status == "FINISHED"
    assert run.data.params["data.train_batch_size"] == "8"
    hist = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.25), (2, 0.75), (3, 1.0)]
    val = client.get_metric_history(run.info.run_id, "val/test_score/meshrl/arith/mean_at_4")
    assert sorted((m.step, m.value) for m in val) == [(1, 0.5), (3, 1.0)]


def test_names_are_checked_and_a_failing_backend_is_dropped(tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown logger 'tensorbord'; known: console, jsonl, tensorboard"):
        make_loggers(["console", "tensorbord"], run_dir=tmp_path)
    lg = make_loggers(["jsonl", "console"], run_dir=tmp_path)
    lg.loggers[0]._f.close()  # the jsonl backend now fails on write
    lg.log({"critic/score/mean": 1.0}, 1)
    lg.log({"critic/score/mean": 2.0}, 2)
    assert [x.name for x in lg.loggers] == ["console"]
    assert capsys.readouterr().out.splitlines() == ["step 1: critic/score/mean=1", "step 2: critic/score/mean=2"]
    lg.close()
