"""What an operator relies on, on a real gateway (uvicorn + gRPC) running stand-in jobs:
paths checked at submit, strict content types, job events, the FIFO queue behind
``max_running_jobs``, logs (tail and follow, per service, REST and gRPC), the access log,
Swagger UI / ReDoc served from the gateway itself, and no secret echoed."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from services.pb import job_pb2, job_pb2_grpc
from tests.integration.gateway_support import (
    STANDIN_DATA, STANDIN_MODEL, TOKEN, VALID_SPEC, auth, fake_launcher, running_gateway, wait_until,
)  # fmt: skip

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[2]
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)


def _spec(**changes):
    spec = yaml.safe_load(yaml.safe_dump(VALID_SPEC))
    for dotted, value in changes.items():
        node = spec
        *head, last = dotted.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    return spec


def _kinds(c: httpx.Client, job_id: str) -> list[str]:
    return [e["kind"] for e in c.get(f"/v1/jobs/{job_id}/events", headers=auth()).json()["events"]]


# ---------------------------------------------------------------------------------------------- submit checks


def test_relative_and_missing_paths_are_refused_at_submit_naming_each(tmp_path):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=2)) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        gone = tmp_path / "gone.parquet"  # under an input root, but missing
        spec = _spec(**{"model.path": "runs/quickstart/model",
                        "data.train_files": [STANDIN_DATA, str(gone), "/nonexistent/x.parquet"],
                        "data.val_files": ["../data/test.parquet"]})  # fmt: skip
        r = c.post("/v1/jobs", json={"spec": spec}, headers=auth())
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert "model.path: relative path 'runs/quickstart/model'" in detail
        assert f"data.train_files[1]: {gone} does not exist" in detail
        assert "data.train_files[2]: /nonexistent/x.parquet is outside the gateway's input roots" in detail
        assert "data.val_files[0]: relative path '../data/test.parquet'" in detail
        assert "data.train_files[0]" not in detail  # the good one is not named
        # The docs' own example: the quickstart file's relative paths are refused the same way, with 400, not 201.
        r = c.post("/v1/jobs", content=(REPO / "examples" / "quickstart.yaml").read_bytes(),
                   headers={**auth(), "Content-Type": "application/yaml"})  # fmt: skip
        assert r.status_code == 400 and "model.path: relative path" in r.json()["detail"], r.text
        # A data file given where a model directory belongs.
        r = c.post("/v1/jobs", json={"spec": _spec(**{"model.path": STANDIN_DATA})}, headers=auth())
        assert r.status_code == 400 and "is not a directory" in r.json()["detail"]
        # Nothing was stored or started.
        assert c.get("/v1/jobs", headers=auth()).json()["jobs"] == []
        # The same check over gRPC.
        stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitJob(job_pb2.JobSubmitRequest(spec_yaml=yaml.safe_dump(spec)), metadata=GRPC_AUTH, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "model.path" in err.value.details()


def test_content_types_are_strict(tmp_path):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=2), grpc=False) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        body = yaml.safe_dump(VALID_SPEC).encode()
        for ctype in ("text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded", ""):
            r = c.post("/v1/jobs", content=body, headers={**auth(), "Content-Type": ctype})
            assert r.status_code == 415, (ctype, r.status_code, r.text)
            assert "application/json or application/yaml" in r.json()["detail"]
        assert c.get("/v1/jobs", headers=auth()).json()["jobs"] == []
        r = c.post("/v1/jobs", content=body, headers={**auth(), "Content-Type": "application/yaml; charset=utf-8"})
        assert r.status_code == 201, r.text


# ---------------------------------------------------------------------------------------------- events, queue


def test_events_record_a_job_life_including_a_service_restart(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=4, FAKE_INTERVAL=0.1, FAKE_RESTARTS=1)
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
        job = c.post("/v1/jobs", json={"spec": VALID_SPEC, "overrides": ["rollout.n=2"]}, headers=auth()).json()
        wait_until(lambda: c.get(f"/v1/jobs/{job['id']}", headers=auth()).json()["state"] == "succeeded",
                   what="job to finish")  # fmt: skip
        wait_until(lambda: "finished" in _kinds(c, job["id"]), what="finished event")
        events = c.get(f"/v1/jobs/{job['id']}/events", headers=auth()).json()["events"]
        kinds = [e["kind"] for e in events]
        assert kinds == ["submitted", "started", "restarted", "finished"], events
        assert events[0]["detail"] == "overrides: rollout.n=2"
        assert events[2]["detail"] == "reward-0 (restart 1)"
        assert events[3]["detail"].startswith("succeeded")
        assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
        since = events[1]["ts"]
        assert [e["kind"] for e in c.get(f"/v1/jobs/{job['id']}/events?since={since}", headers=auth()).json()["events"]] \
            == ["restarted", "finished"]  # fmt: skip
        assert c.get("/v1/jobs/nope-1/events", headers=auth()).status_code == 404
        stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
        reply = stub.GetJobEvents(job_pb2.JobEventsRequest(id=job["id"]), metadata=GRPC_AUTH, timeout=10)
        assert [e.kind for e in reply.events] == kinds and reply.state == "succeeded"
        with pytest.raises(grpc.RpcError) as err:
            stub.GetJobEvents(job_pb2.JobEventsRequest(id=job["id"]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # gRPC calls are in the access log too, with their status code.
        log = wait_until(lambda: (t := (tmp_path / "runs" / "gateway-access.log").read_text())
                         and "GetJobEvents\" UNAUTHENTICATED" in t and t, what="gRPC access lines")  # fmt: skip
        assert '"GRPC /meshrl.v1.JobService/GetJobEvents" OK' in log and TOKEN not in log


def test_max_running_jobs_queues_submits_first_in_first_out(tmp_path):
    from gateway_svc.server import Gateway, GatewaySettings

    launcher = fake_launcher(FAKE_STEPS=25, FAKE_INTERVAL=0.15)  # long enough to see the others wait
    settings = GatewaySettings(token=TOKEN, port=0, grpc_port=None, runs_dir=tmp_path / "runs", poll_interval=0.1,
                               cancel_timeout=2.0, max_running_jobs=1,
                               input_roots=[Path(STANDIN_MODEL).parent])  # fmt: skip
    gw = Gateway(settings, launcher=launcher).start()
    try:
        with httpx.Client(base_url=gw.http_url, timeout=10) as c:
            ids = [c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"] for _ in range(3)]
            states = {j["id"]: j for j in c.get("/v1/jobs", headers=auth()).json()["jobs"]}
            assert states[ids[0]]["state"] == "running"
            for queued in ids[1:]:
                assert states[queued]["state"] == "pending" and states[queued]["detail"].startswith("queued:")
                assert _kinds(c, queued) == ["submitted", "queued"]
            # Cancelling a queued job never starts it; the first job finishing starts the next one in order.
            assert c.post(f"/v1/jobs/{ids[2]}:cancel", headers=auth()).json()["state"] == "cancelled"
            assert not (tmp_path / "runs" / ids[2]).exists()

            def state(i: int) -> str:
                return c.get(f"/v1/jobs/{ids[i]}", headers=auth()).json()["state"]

            running_at_once = set()
            deadline = time.monotonic() + 90
            while state(1) != "succeeded" and time.monotonic() < deadline:
                now = [i for i in range(3) if state(i) in ("running", "paused")]
                running_at_once.add(len(now))
                time.sleep(0.05)
            assert state(0) == "succeeded" and state(1) == "succeeded" and state(2) == "cancelled"
            assert max(running_at_once) == 1
            ev0 = c.get(f"/v1/jobs/{ids[0]}/events", headers=auth()).json()["events"]
            ev1 = c.get(f"/v1/jobs/{ids[1]}/events", headers=auth()).json()["events"]
            started1 = next(e["ts"] for e in ev1 if e["kind"] == "started")
            finished0 = next(e["ts"] for e in ev0 if e["kind"] == "finished")
            assert started1 >= finished0  # it waited for the slot
            assert _kinds(c, ids[2]) == ["submitted", "queued", "cancelled", "finished"]
    finally:
        for row in gw.store.list(limit=100):
            if row.handle:
                launcher.cancel(row.handle, timeout=2.0)
        gw.stop()


# ---------------------------------------------------------------------------------------------- logs


def test_logs_tail_and_follow_per_service_over_rest_and_grpc(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=30, FAKE_INTERVAL=0.05, FAKE_SERVICE_LOGS=1)
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=30) as c:
        job_id = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        wait_until(lambda: (tmp_path / "runs" / job_id / "logs" / "trainer.log").exists(), what="service logs")
        # follow: every step's line arrives, and the stream ends by itself when the job finishes
        with c.stream("GET", f"/v1/jobs/{job_id}/logs", params={"service": "trainer", "follow": "true",
                                                                 "tail": 0, "max_seconds": 60}, headers=auth()) as r:  # fmt: skip
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert set(r.headers["x-log-services"].split(",")) == {"job", "trainer", "rollout-0"}
            text = "".join(r.iter_text())
        assert c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["state"] == "succeeded"
        assert "trainer: step 30" in text
        steps = [int(m) for m in re.findall(r"trainer: step (\d+)", text)]
        assert steps == list(range(steps[0], 31))  # in order, none missing from where it started
        # tail: the last lines only, per service
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"service": "rollout-0", "tail": 3}, headers=auth())
        assert r.text.splitlines() == ["rollout-0: step 28", "rollout-0: step 29", "rollout-0: step 30"]
        r = c.get(f"/v1/jobs/{job_id}/logs", headers=auth())  # default: the driver's log
        assert "fake job: finished" in r.text
        # unknown or sneaky service names: 404 listing the logs there are
        for bad in ("reward-7", "../spec", "..", "job.log"):
            r = c.get(f"/v1/jobs/{job_id}/logs", params={"service": bad}, headers=auth())
            assert r.status_code in (404, 422), (bad, r.status_code)
            if r.status_code == 404:
                assert "logs: job, rollout-0, trainer" in r.json()["detail"]
        assert c.get(f"/v1/jobs/{job_id}/logs", params={"tail": -1}, headers=auth()).status_code == 422
        assert c.get("/v1/jobs/nope-1/logs", headers=auth()).status_code == 404
        assert c.get(f"/v1/jobs/{job_id}/logs").status_code == 401
        # gRPC: the same, streamed
        stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
        chunks = stub.GetJobLogs(job_pb2.JobLogsRequest(id=job_id, service="trainer", tail=2), metadata=GRPC_AUTH,
                                 timeout=10)  # fmt: skip
        assert b"".join(ch.data for ch in chunks).decode().splitlines() == ["trainer: step 29", "trainer: step 30"]
        chunks = stub.GetJobLogs(job_pb2.JobLogsRequest(id=job_id, follow=True), metadata=GRPC_AUTH, timeout=10)
        assert b"fake job: finished" in b"".join(ch.data for ch in chunks)  # ends: the job is finished
        with pytest.raises(grpc.RpcError) as err:
            list(stub.GetJobLogs(job_pb2.JobLogsRequest(id=job_id, service="nope"), metadata=GRPC_AUTH, timeout=10))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "rollout-0" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            list(stub.GetJobLogs(job_pb2.JobLogsRequest(id=job_id), timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_follow_on_a_running_job_stops_after_max_seconds(tmp_path):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.2), grpc=False) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=30) as c:  # fmt: skip
        job_id = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        wait_until(lambda: c.get(f"/v1/jobs/{job_id}/logs", headers=auth()).status_code == 200, what="job log")
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"follow": "true", "max_seconds": 1}, headers=auth())
        assert r.status_code == 200 and "fake job: step" in r.text
        assert c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["state"] == "running"


# ---------------------------------------------------------------------------------------------- ops surface


def test_access_log_docs_assets_and_no_secret_echoed(tmp_path):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=2), grpc=False) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        for path, asset in (("/docs", "/static/swagger-ui-bundle.js"), ("/redoc", "/static/redoc.standalone.js")):
            page = c.get(path)
            assert page.status_code == 200 and asset in page.text
            external = re.findall(r"""(?:src|href)=["'](https?:)?//""", page.text)
            assert not external, f"{path} loads something from outside the gateway: {external}"
            js = c.get(asset)
            assert js.status_code == 200 and len(js.content) > 100_000
        assert c.get("/static/swagger-ui.css").status_code == 200
        # the raw path, as an attacker sends it: httpx would normalise "/static/../gateway.db" to "/gateway.db"
        host, port = gw.http_url.rsplit("/", 1)[1].rsplit(":", 1)
        for raw in ("/static/../gateway.db", "/static/%2e%2e/gateway.db", "/static/..%2fgateway.db",
                    "/static/../../runs/gateway.db"):
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.putrequest("GET", raw, skip_accept_encoding=True)
            conn.endheaders()
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            assert resp.status == 404 and b"SQLite format" not in body, (raw, resp.status, body[:100])
        wrong = "wrong-token-value-xyz"
        r = c.get("/v1/jobs?limit=5", headers=auth(wrong))
        assert r.status_code == 401 and wrong not in r.text
        log = wait_until(lambda: (tmp_path / "runs" / "gateway-access.log").read_text()
                         if (tmp_path / "runs" / "gateway-access.log").exists() else "", what="access log")  # fmt: skip
        wait_until(lambda: '"GET /v1/jobs" 401' in (tmp_path / "runs" / "gateway-access.log").read_text(),
                   what="access log line")  # fmt: skip
        log = (tmp_path / "runs" / "gateway-access.log").read_text()
        assert '"GET /docs" 200' in log and "limit=5" not in log and wrong not in log and TOKEN not in log


def test_a_queue_password_is_never_stored_or_returned_but_the_job_gets_it(tmp_path):
    """queues.password, a password in the Redis URL and one in an override: ``***`` in the
    store, in GET /v1/jobs/{id} and ListJobs (REST and gRPC), in the events; the real values
    only in the job's run dir, in files only the gateway's user can read."""
    pw_field, pw_url, pw_override = "field-pw-Q7x2", "url-pw-Z9k4", "override-pw-M3v8"
    spec = _spec(**{"queues.type": "redis", "queues.url": f"redis://meshrl:{pw_url}@redis.example:6379/0",
                    "queues.password": pw_field})  # fmt: skip
    secrets = (pw_field, pw_url, pw_override)
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=2, FAKE_INTERVAL=1)) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        r = c.post("/v1/jobs", json={"spec": spec}, headers=auth())
        assert r.status_code == 201, r.text
        rest_id = r.json()["id"]
        stub = job_pb2_grpc.JobServiceStub(grpc.insecure_channel(gw.grpc_address))
        sub = stub.SubmitJob(job_pb2.JobSubmitRequest(
            spec_yaml=yaml.safe_dump(_spec(**{"queues.type": "redis", "queues.url": "redis://redis.example:6379/0"})),
            overrides=[f"queues.password={pw_override}"]), metadata=GRPC_AUTH, timeout=10)  # fmt: skip
        shown = [r.text, c.get(f"/v1/jobs/{rest_id}", headers=auth()).text, c.get("/v1/jobs", headers=auth()).text,
                 c.get(f"/v1/jobs/{sub.id}", headers=auth()).text, c.get(f"/v1/jobs/{sub.id}/events", headers=auth()).text,
                 str(sub), str(stub.GetJob(job_pb2.JobIdRequest(id=rest_id), metadata=GRPC_AUTH, timeout=10)),
                 str(stub.GetJob(job_pb2.JobIdRequest(id=sub.id), metadata=GRPC_AUTH, timeout=10)),
                 str(stub.ListJobs(job_pb2.JobListRequest(), metadata=GRPC_AUTH, timeout=10))]  # fmt: skip
        for text in shown:
            assert not any(pw in text for pw in secrets), text[:3000]
        got = yaml.safe_load(c.get(f"/v1/jobs/{rest_id}", headers=auth()).json()["spec"])
        assert got["queues"]["password"] == "***" and got["queues"]["url"] == "redis://meshrl:***@redis.example:6379/0"
        assert c.get(f"/v1/jobs/{sub.id}", headers=auth()).json()["overrides"] == ["queues.password=***"]
        # The job runs with the real values: the spec in its run dir, readable by the gateway's user only.
        for job_id, want in ((rest_id, (pw_field, pw_url)), (sub.id, (pw_override,))):
            run_spec = tmp_path / "runs" / job_id / "spec.yaml"
            wait_until(run_spec.exists, what="the job's spec file")
            assert all(pw in run_spec.read_text() for pw in want)
            assert run_spec.stat().st_mode & 0o777 == 0o600
            assert not (tmp_path / "runs" / job_id / "secrets.json").exists()  # handed over, not kept twice
        wait_until(lambda: c.get(f"/v1/jobs/{rest_id}", headers=auth()).json()["state"] == "succeeded",
                   what="the job to finish")  # fmt: skip
    # ... and the job store on disk never held them.
    stored = b"".join(p.read_bytes() for p in (tmp_path / "runs").glob("gateway.db*"))
    assert stored and not any(pw.encode() in stored for pw in secrets)


def test_a_too_short_token_is_refused_without_echoing_it(tmp_path):
    secret = "s3cr7"
    r = subprocess.run([sys.executable, "-m", "meshrl_cli", "gateway", "--runs-dir", str(tmp_path), "--port", "0",
                        "--grpc-port", "-1"], env={**os.environ, "MESHRL_GATEWAY_TOKEN": secret},
                       cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and "token" in r.stderr and "at least 8" in r.stderr, r.stderr
    assert secret not in r.stderr + r.stdout
    from pydantic import ValidationError

    from gateway_svc.server import GatewaySettings

    with pytest.raises(ValidationError) as err:
        GatewaySettings(token=secret)
    assert secret not in str(err.value) and secret not in repr(err.value)
    assert "s3cr" not in repr(GatewaySettings(token="s3cr7-long-enough"))


def test_a_follower_that_hangs_up_leaves_no_reader_behind(tmp_path):
    import sys

    def readers() -> int:  # threads of this process (the gateway runs in it) inside logs.follow
        n = 0
        for frame in sys._current_frames().values():
            while frame is not None:
                if frame.f_code.co_name == "follow" and frame.f_code.co_filename.endswith("gateway/logs.py"):
                    n += 1
                    break
                frame = frame.f_back
        return n

    # A job whose log stays quiet (one line, then a long step): nothing to send to the followers.
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=2, FAKE_INTERVAL=600), grpc=False) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=30) as c:  # fmt: skip
        job_id = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        wait_until(lambda: c.get(f"/v1/jobs/{job_id}/logs", headers=auth()).status_code == 200, what="job log")
        for _ in range(3):
            with c.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true", "max_seconds": 3600},
                          headers=auth()) as r:  # fmt: skip
                assert r.status_code == 200
                next(r.iter_bytes())  # reading ...
            # ... and hanging up
        assert readers() <= 3
        wait_until(lambda: readers() == 0, timeout=10, what="the followers' readers to stop")
        assert c.get(f"/v1/jobs/{job_id}", headers=auth()).json()["state"] == "running"
