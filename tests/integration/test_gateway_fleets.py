"""The gateway's fleets (/v1/fleets over REST, StartFleet/ListFleets/GetFleet/StopFleet over
gRPC) on a real gateway on loopback.

The fleet's process is a stand-in (gateway_fake_fleet.py: the real fleet process of fleet_svc,
its state file, scaling policy and events, with stand-in replicas instead of vLLM) except in
the last test, which starts a real fleet with a vLLM replica of the tiny model through the
gateway. An elastic fleet scales on a job's load (a load.json written as a job's controller
writes it) and is rescaled over REST and gRPC; a gateway process killed while its fleet adds a
replica and started again finds the fleet with the replica it added. A job the gateway launches (the real job
controller) that names a fleet which never ran under the gateway fails with the reason, in
the gateway's fleets directory: the launcher hands the job the gateway's MESHRL_FLEETS_DIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from services.fleets import FleetDir
from services.pb import job_pb2, job_pb2_grpc
from tests.integration.gateway_support import (
    FAKE_FLEET, STANDIN_MODEL, TOKEN, auth, fake_launcher, running_gateway, wait_until,
)  # fmt: skip

pytestmark = pytest.mark.timeout(180)
META = (("authorization", f"Bearer {TOKEN}"),)
FAKE = [sys.executable, str(FAKE_FLEET)]
SPEC = {"name": "smol", "model": {"path": STANDIN_MODEL, "lora_rank": 8},
        "rollout": {"prompt_length": 32, "response_length": 8}, "max_jobs": 2}  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("fleets"), fake_launcher(), fleet_command=FAKE) as gw:
        yield gw


@pytest.fixture
def client(gw):
    with httpx.Client(base_url=gw.http_url, headers=auth(), timeout=30) as c:
        yield c


@pytest.fixture
def stub(gw):
    with grpc.insecure_channel(gw.grpc_address) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield job_pb2_grpc.JobServiceStub(channel)


def _spec(**changes):
    out = yaml.safe_load(yaml.safe_dump(SPEC))
    for key, value in changes.items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _state(client, name):
    return client.get(f"/v1/fleets/{name}").json()["state"]


@pytest.mark.parametrize("headers", [{}, auth("wrong-token"), {"Authorization": TOKEN}])
def test_no_fleet_route_or_method_works_without_the_token(gw, stub, headers):
    with httpx.Client(base_url=gw.http_url, headers=headers, timeout=30) as anon:
        for method, path in [("POST", "/v1/fleets"), ("GET", "/v1/fleets"), ("GET", "/v1/fleets/smol"),
                             ("DELETE", "/v1/fleets/smol"), ("PATCH", "/v1/fleets/smol"),
                             ("GET", "/v1/fleets/smol/events")]:  # fmt: skip
            r = anon.request(method, path, json={"spec": SPEC})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path, r.text)
    metadata = tuple((k.lower(), v) for k, v in headers.items())
    for call, request in [(stub.StartFleet, job_pb2.FleetStartRequest(spec_yaml=yaml.safe_dump(SPEC))),
                          (stub.ListFleets, job_pb2.FleetListRequest()),
                          (stub.GetFleet, job_pb2.FleetNameRequest(name="smol")),
                          (stub.ScaleFleet, job_pb2.FleetScaleRequest(name="smol", max_replicas=1)),
                          (stub.GetFleetEvents, job_pb2.FleetEventsRequest(name="smol")),
                          (stub.StopFleet, job_pb2.FleetStopRequest(name="smol"))]:  # fmt: skip
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=metadata, timeout=10)
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert not (gw.fleets.root / "smol").exists()  # a valid spec without the token started nothing


@pytest.mark.parametrize(
    "body, field",
    [
        ({"spec": _spec(name="Bad_Name")}, "name"),
        ({"spec": _spec(**{"model.lora_rank": 0})}, "model.lora_rank must be > 0"),
        ({"spec": {k: v for k, v in SPEC.items() if k != "rollout"}}, "rollout"),
        ({"spec": _spec(**{"rollout.prompt_length": None})}, "rollout.prompt_length"),
        ({"spec": _spec(replicaz=2)}, "replicaz"),
        ({"spec": SPEC, "overrides": ["replicas=0"]}, "replicas"),
        ({"spec": SPEC, "overrides": [5]}, "overrides"),
        ({"spec": "name: [oops"}, "spec"),
        ({"spec": "- a list"}, "spec"),
        ({"spek": SPEC}, "spek"),
        # the operator's policy (issue 40): inputs under the input roots, no capability granted by the spec
        ({"spec": _spec(**{"model.path": "/etc"})}, "model.path: /etc is outside the gateway's input roots"),
        ({"spec": _spec(**{"model.path": "relative/model"})}, "model.path: relative path"),
        ({"spec": _spec(**{"model.tokenizer_path": "/usr/share"})}, "model.tokenizer_path: /usr/share is outside"),
        ({"spec": _spec(**{"model.trust_remote_code": True})}, "--allow trust_remote_code"),
        ({"spec": _spec(**{"services.host": "0.0.0.0"})}, "services.host"),
        ({"spec": _spec(**{"model.lora_adapter_path": STANDIN_MODEL})}, "model.lora_adapter_path"),
    ],
)
def test_a_bad_fleet_spec_is_a_400_naming_the_field_and_starts_nothing(gw, client, body, field):
    before = client.get("/v1/fleets").json()["fleets"]
    r = client.post("/v1/fleets", json=body)
    assert r.status_code == 400, r.text
    assert field in r.json()["detail"], r.json()["detail"]
    assert client.get("/v1/fleets").json()["fleets"] == before
    assert not (gw.fleets.root / "Bad_Name").exists()


def test_a_model_inside_the_runs_dir_is_refused(gw, client):
    inside = gw.fleets.root.parent / "some-job" / "model"
    inside.mkdir(parents=True, exist_ok=True)
    r = client.post("/v1/fleets", json={"spec": _spec(**{"model.path": str(inside)})})
    assert r.status_code == 400 and "model.path" in r.json()["detail"], r.text


def test_other_bad_requests_are_4xx(client):
    assert client.post("/v1/fleets", content=b"x", headers={"Content-Type": "image/png"}).status_code == 415
    assert client.post("/v1/fleets", content=b"{nope", headers={"Content-Type": "application/json"}).status_code == 400
    assert client.post("/v1/fleets", content=b"a" * (2 << 20),
                       headers={"Content-Type": "application/yaml"}).status_code == 413  # fmt: skip
    r = client.get("/v1/fleets/nope")
    assert r.status_code == 404 and "nope" in r.json()["detail"]
    assert client.delete("/v1/fleets/nope").status_code == 404
    assert client.get("/v1/fleets/Not_A_Name").status_code == 422
    assert client.patch("/v1/fleets/nope", json={"max_replicas": 2}).status_code == 404
    assert client.get("/v1/fleets/nope/events").status_code == 404
    assert client.get("/v1/fleets/x/events?since=-1").status_code == 422
    assert client.delete("/v1/fleets/x?timeout=-1").status_code == 422


def test_fleet_lifecycle_start_409_list_jobs_stop(gw, client):
    text = yaml.safe_dump(SPEC)  # the YAML file itself, with an override
    r = client.post("/v1/fleets", content=text, params={"override": "replicas=2"},
                    headers={"Content-Type": "application/yaml"})  # fmt: skip
    assert r.status_code == 201, r.text
    fleet = r.json()
    assert fleet["name"] == "smol" and fleet["state"] in ("starting", "ready") and fleet["pid"] > 0
    assert fleet["model"] == STANDIN_MODEL and fleet["max_jobs"] == 2
    again = client.post("/v1/fleets", json={"spec": SPEC})
    assert again.status_code == 409 and "smol" in again.json()["detail"], again.text
    wait_until(lambda: _state(client, "smol") == "ready", what="fleet ready")
    got = client.get("/v1/fleets/smol").json()
    assert got["pid"] == fleet["pid"] and set(got["replicas"]) == {"rollout-0", "rollout-1"}
    assert got["replicas"]["rollout-0"]["alive"] and "replicas: 2" in got["spec"]
    # the fleet's directory is the gateway's, private; its process is in a session of its own
    root = gw.fleets.root
    assert root == (gw.settings.runs_dir / "fleets").resolve() and oct(root.stat().st_mode & 0o777) == "0o700"
    assert os.getsid(fleet["pid"]) == fleet["pid"] != os.getsid(0)
    # a job attached (as a job's controller and the fleet's replicas write it): listed with each report
    fdir = FleetDir("smol", root)
    fdir.attach("arith-1a2b3c4d", {"rollout-0": "x: 1\n", "rollout-1": "x: 1\n"}, "credential")
    fdir.report("rollout-0", "arith-1a2b3c4d", "attached", metrics="127.0.0.1:1234", served_version=3)
    fdir.report("rollout-1", "arith-1a2b3c4d", "refused", detail="model.lora_rank (16) exceeds the largest rank")
    listed = {f["name"]: f for f in client.get("/v1/fleets").json()["fleets"]}
    assert listed["smol"]["state"] == "ready" and listed["smol"]["spec"] is None  # the spec: GET one only
    reports = listed["smol"]["jobs"]["arith-1a2b3c4d"]
    assert reports["rollout-0"]["state"] == "attached" and reports["rollout-0"]["served_version"] == 3
    assert reports["rollout-0"]["metrics"] == "127.0.0.1:1234"
    assert reports["rollout-1"]["state"] == "refused" and "exceeds" in reports["rollout-1"]["detail"]
    fdir.detach("arith-1a2b3c4d")
    # stop: the fleet's own protocol, waited for
    r = client.delete("/v1/fleets/smol")
    assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    assert wait_until(lambda: _gone(fleet["pid"]), what="fleet process gone")
    assert client.delete("/v1/fleets/smol").status_code == 409
    assert client.get("/v1/fleets/smol").json()["state"] == "stopped"
    # a stopped fleet may start again, as a new process
    r = client.post("/v1/fleets", json={"spec": SPEC})
    assert r.status_code == 201 and r.json()["pid"] != fleet["pid"], r.text
    assert client.delete("/v1/fleets/smol").json()["state"] == "stopped"


def _gone(pid: int) -> bool:
    """The process has exited and was reaped (no zombie left behind by the gateway)."""
    return not Path(f"/proc/{pid}").exists()


def test_a_fleet_that_fails_to_start_says_why(gw, client):
    gw.fleets.env["FAKE_FLEET_FAIL"] = "1"
    try:
        r = client.post("/v1/fleets", json={"spec": _spec(name="broken")})
    finally:
        del gw.fleets.env["FAKE_FLEET_FAIL"]
    assert r.status_code == 201, r.text
    wait_until(lambda: _state(client, "broken") == "failed", what="fleet failed")
    detail = client.get("/v1/fleets/broken").json()["detail"]
    assert "exited before it started" in detail and "failing on purpose" in detail, detail
    assert client.delete("/v1/fleets/broken").status_code == 409


def test_stop_past_its_deadline_is_a_202_still_stopping(gw, client):
    gw.fleets.env["FAKE_FLEET_STOP_S"] = "3"
    try:
        assert client.post("/v1/fleets", json={"spec": _spec(name="slow")}).status_code == 201
    finally:
        del gw.fleets.env["FAKE_FLEET_STOP_S"]
    wait_until(lambda: _state(client, "slow") == "ready", what="fleet ready")
    r = client.delete("/v1/fleets/slow", params={"timeout": 0.5})
    assert r.status_code == 202 and r.json()["state"] == "stopping", r.text
    assert client.post("/v1/fleets", json={"spec": _spec(name="slow")}).status_code == 409  # not stopped yet
    wait_until(lambda: _state(client, "slow") == "stopped", timeout=30, what="fleet stopped")


def test_fleets_over_grpc(stub):
    start = stub.StartFleet(job_pb2.FleetStartRequest(spec_yaml=yaml.safe_dump(_spec(name="grpc")),
                                                      overrides=["max_jobs=3"]), metadata=META, timeout=30)  # fmt: skip
    assert start.name == "grpc" and start.state in ("starting", "ready") and start.max_jobs == 3
    wait_until(lambda: stub.GetFleet(job_pb2.FleetNameRequest(name="grpc"), metadata=META).state == "ready")
    got = stub.GetFleet(job_pb2.FleetNameRequest(name="grpc"), metadata=META, timeout=10)
    assert got.pid == start.pid and got.replicas["rollout-0"].alive and "max_jobs: 3" in got.spec_yaml
    assert "grpc" in [f.name for f in stub.ListFleets(job_pb2.FleetListRequest(), metadata=META, timeout=10).fleets]
    with pytest.raises(grpc.RpcError) as err:
        stub.StartFleet(job_pb2.FleetStartRequest(spec_yaml=yaml.safe_dump(_spec(name="grpc"))), metadata=META)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    stopped = stub.StopFleet(job_pb2.FleetStopRequest(name="grpc", timeout_s=30), metadata=META, timeout=40)
    assert stopped.state == "stopped"
    for call, request, code, words in [
        (stub.StartFleet, job_pb2.FleetStartRequest(spec_yaml=yaml.safe_dump(_spec(**{"model.path": "/etc"}))),
         grpc.StatusCode.INVALID_ARGUMENT, "outside the gateway's input roots"),
        (stub.StartFleet, job_pb2.FleetStartRequest(spec_yaml="name: x"), grpc.StatusCode.INVALID_ARGUMENT, "model"),
        (stub.GetFleet, job_pb2.FleetNameRequest(name="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
        (stub.GetFleet, job_pb2.FleetNameRequest(name="../x"), grpc.StatusCode.NOT_FOUND, "../x"),
        (stub.StopFleet, job_pb2.FleetStopRequest(name="grpc"), grpc.StatusCode.FAILED_PRECONDITION, "stopped"),
        (stub.StopFleet, job_pb2.FleetStopRequest(name="grpc", timeout_s=float("nan")),
         grpc.StatusCode.INVALID_ARGUMENT, "timeout_s"),
    ]:  # fmt: skip
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=META, timeout=10)
        assert err.value.code() is code and words in err.value.details(), (code, err.value.details())


def test_fleets_survive_a_gateway_restart(tmp_path):
    with running_gateway(tmp_path, fake_launcher(), fleet_command=FAKE, keep_fleets=True) as gw:
        with httpx.Client(base_url=gw.http_url, headers=auth(), timeout=30) as c:
            pid = c.post("/v1/fleets", json={"spec": SPEC}).json()["pid"]
            wait_until(lambda: _state(c, "smol") == "ready", what="fleet ready")
    with running_gateway(tmp_path, fake_launcher(), fleet_command=FAKE) as gw:  # a new gateway process's view
        with httpx.Client(base_url=gw.http_url, headers=auth(), timeout=30) as c:
            got = c.get("/v1/fleets/smol").json()
            assert got["state"] == "ready" and got["pid"] == pid, got
            assert c.post("/v1/fleets", json={"spec": SPEC}).status_code == 409
            r = c.delete("/v1/fleets/smol")
            assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
    assert wait_until(lambda: _gone(pid), what="fleet process gone")


# -- an elastic fleet: its replicas' phases, its scaling block and decisions, its bounds ---------------------------

ELASTIC = {**SPEC, "name": "elastic", "replicas": 1,
           "scaling": {"min_replicas": 1, "max_replicas": 3, "interval_s": 0.2, "up_backlog": 4, "down_backlog": 1,
                       "up_after_s": 0.3, "down_after_s": 600, "cooldown_s": 0.5}}  # fmt: skip
JOB = "arith-5e5e5e5e"


def _attach_busy_job(fdir: FleetDir, backlog: int = 6, version: int = 2) -> None:
    """A job attached with ``backlog`` prompt groups queued, none leased, at ``version`` (its
    view for every replica the fleet may run and its load, as its controller writes them)."""
    if not fdir.job_dir(JOB).is_dir():
        fdir.attach(JOB, {f"rollout-{i}": "x: 1\n" for i in range(3)}, "credential")
    fdir.write_load(JOB, {"prompts": backlog, "leased": 0, "trainer_wait_s": 0.0, "dropped_stale": 0,
                          "tokens_per_s": 10.0, "version": version})  # fmt: skip


def _phases(view: dict) -> dict[str, str]:
    return {name: r["phase"] for name, r in view["replicas"].items()}


def test_an_elastic_fleet_shows_its_phases_scaling_and_decisions_and_takes_new_bounds(gw, client, stub):
    r = client.post("/v1/fleets", json={"spec": ELASTIC})
    assert r.status_code == 201, r.text
    wait_until(lambda: _state(client, "elastic") == "ready", what="fleet ready")
    got = client.get("/v1/fleets/elastic").json()
    # every replica the fleet may run, each with its phase; the scaling block as the fleet wrote it
    assert _phases(got) == {"rollout-0": "serving", "rollout-1": "off", "rollout-2": "off"}, got["replicas"]
    sc = got["scaling"]
    assert (sc["min"], sc["max"], sc["desired"], sc["policy"], sc["requested"]) == (1, 3, 1, "backlog", None), sc
    assert got["metrics"] and httpx.get(f"http://{got['metrics']}/metrics", timeout=5).status_code == 200
    assert client.get("/v1/fleets/elastic/events").json() == {"name": "elastic", "state": "ready", "events": []}

    # a job with 6 groups waiting: 6 per replica >= 4 -> one replica more (then 3 per replica: it holds)
    fdir = FleetDir("elastic", gw.fleets.root)
    _attach_busy_job(fdir)

    def grown():
        _attach_busy_job(fdir)  # the job's controller writes its load at every observation
        v = client.get("/v1/fleets/elastic").json()
        return v if _phases(v)["rollout-1"] == "serving" and v["scaling"]["desired"] == 2 else None

    got = wait_until(grown, timeout=30, what="a second replica serving")
    assert got["scaling"]["signals"]["backlog"] == 6 and got["scaling"]["signals"]["jobs"] == 1, got["scaling"]
    reports = wait_until(lambda: (j := client.get("/v1/fleets/elastic").json()["jobs"].get(JOB)) and len(j) == 2 and j,
                         what="both replicas' reports")  # fmt: skip
    assert {rep: r["served_version"] for rep, r in reports.items()} == {"rollout-0": 2, "rollout-1": 2}, reports
    events = client.get("/v1/fleets/elastic/events").json()["events"]
    assert len(events) == 1, events
    e = events[0]
    assert (e["action"], e["reason"], e["replicas"], e["from"], e["to"]) == ("add", "backlog_high", ["rollout-1"], 1, 2)
    assert e["signals"]["backlog_per_replica"] == 6 and "now" not in e["signals"] and e["ts"] > got["started_at"]
    assert client.get("/v1/fleets/elastic/events", params={"since": e["ts"]}).json()["events"] == []

    # the same over gRPC
    info = stub.GetFleet(job_pb2.FleetNameRequest(name="elastic"), metadata=META, timeout=10)
    assert info.replicas["rollout-1"].phase == "serving" and info.replicas["rollout-2"].phase == "off"
    assert (info.scaling.min, info.scaling.max, info.scaling.desired) == (1, 3, 2) and info.metrics == got["metrics"]
    assert info.scaling.signals["backlog"] == 6 and not info.scaling.HasField("requested")
    reply = stub.GetFleetEvents(job_pb2.FleetEventsRequest(name="elastic"), metadata=META, timeout=10)
    assert [(x.action, x.reason, list(x.replicas), x.from_replicas, x.to_replicas) for x in reply.events] == [
        ("add", "backlog_high", ["rollout-1"], 1, 2)]

    # bounds that do not fit: 4xx naming them, nothing written
    for body, status, words in [
        ({"min_replicas": 3, "max_replicas": 2}, 400, "min_replicas (3) is above max_replicas (2)"),
        ({"max_replicas": 4}, 400, "max_replicas: 4 is above the fleet's largest count 3"),
        ({"min_replicas": 0}, 422, "min_replicas"),
        ({"replicas": 2, "max_replicas": 2}, 400, "either replicas"),
        ({}, 400, "give min_replicas, max_replicas or replicas"),
        ({"maximum": 2}, 422, "maximum"),
        ({"max_replicas": "two"}, 422, "max_replicas"),
    ]:  # fmt: skip
        r = client.patch("/v1/fleets/elastic", json=body)
        assert r.status_code == status and words in r.json()["detail"], (body, r.status_code, r.text)
    assert not fdir.bounds_file.exists()
    with pytest.raises(grpc.RpcError) as err:
        stub.ScaleFleet(job_pb2.FleetScaleRequest(name="elastic", min_replicas=2, max_replicas=9), metadata=META)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "max_replicas: 9" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.ScaleFleet(job_pb2.FleetScaleRequest(name="elastic"), metadata=META)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    # max 1 over REST: the fleet drains its newest replica (above_max), whatever the backlog
    r = client.patch("/v1/fleets/elastic", json={"max_replicas": 1})
    assert r.status_code == 200 and r.json()["scaling"]["requested"] == {"min": 1, "max": 1}, r.text
    assert fdir.requested_bounds() == (1, 1)

    def shrunk():
        _attach_busy_job(fdir)
        v = client.get("/v1/fleets/elastic").json()
        return v if _phases(v)["rollout-1"] == "off" and (v["scaling"]["min"], v["scaling"]["max"]) == (1, 1) else None

    got = wait_until(shrunk, timeout=30, what="rollout-1 drained")
    assert got["scaling"]["desired"] == 1 and got["scaling"]["requested"] == {"min": 1, "max": 1}
    assert wait_until(lambda: client.get("/v1/fleets/elastic").json()["jobs"][JOB]["rollout-1"]["state"] == "detached",
                      what="the drained replica's report")  # fmt: skip
    last = client.get("/v1/fleets/elastic/events").json()["events"][-1]
    assert (last["action"], last["reason"], last["replicas"], last["from"], last["to"]) == (
        "remove", "above_max", ["rollout-1"], 2, 1)

    # 1..3 again over gRPC (the one left out stays): the backlog brings rollout-1 back
    info = stub.ScaleFleet(job_pb2.FleetScaleRequest(name="elastic", max_replicas=3), metadata=META, timeout=10)
    assert (info.scaling.requested.min, info.scaling.requested.max) == (1, 3)
    wait_until(grown, timeout=30, what="rollout-1 serving again")
    reasons = [(e["action"], e["reason"]) for e in client.get("/v1/fleets/elastic/events").json()["events"]]
    assert reasons == [("add", "backlog_high"), ("remove", "above_max"), ("add", "backlog_high")], reasons

    fdir.detach(JOB)
    assert client.delete("/v1/fleets/elastic").json()["state"] == "stopped"
    stopped = client.get("/v1/fleets/elastic").json()
    assert set(_phases(stopped).values()) == {"off"} and stopped["scaling"]["requested"] is None, stopped
    assert stopped["metrics"] is None
    r = client.patch("/v1/fleets/elastic", json={"max_replicas": 2})
    assert r.status_code == 409 and "only a running fleet can be scaled" in r.json()["detail"], r.text
    assert len(client.get("/v1/fleets/elastic/events").json()["events"]) == 3  # the record outlives the run


# -- the gateway killed while its fleet scales up ------------------------------------------------------------------

GATEWAY_PROCESS = Path(__file__).with_name("gateway_process.py")


def _start_gateway_process(runs: Path, env: dict[str, str]) -> tuple[subprocess.Popen, dict]:
    out = runs.parent / f"gateway-{time.monotonic_ns()}.json"
    log = open(runs.parent / "gateway-process.log", "ab")  # noqa: SIM115 -- the child's output
    proc = subprocess.Popen([sys.executable, str(GATEWAY_PROCESS), str(runs), str(out)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, **env})  # fmt: skip
    log.close()
    addresses = wait_until(lambda: (proc.poll() is None or _fail(runs)) and out.exists()
                           and json.loads(out.read_text()), timeout=60, what="the gateway process serving")  # fmt: skip
    return proc, addresses


def _fail(runs: Path) -> None:
    raise AssertionError("the gateway process exited:\n" + (runs.parent / "gateway-process.log").read_text()[-3000:])


def test_a_gateway_killed_while_its_fleet_scales_up_finds_the_fleet_and_its_new_replica(tmp_path):
    from gateway_svc.fleets import _alive

    runs = tmp_path / "runs"
    runs.mkdir()
    # each replica takes 3 s to start: long enough to kill the gateway while one joins
    env = {"FAKE_FLEET_START_S": "3"}
    gw1, addr = _start_gateway_process(runs, env)
    fleet_pid = None
    try:
        with httpx.Client(base_url=addr["http"], headers=auth(), timeout=30) as c:
            r = c.post("/v1/fleets", json={"spec": ELASTIC})
            assert r.status_code == 201, r.text
            fleet_pid = r.json()["pid"]
            wait_until(lambda: _state(c, "elastic") == "ready", timeout=30, what="fleet ready")
            fdir = FleetDir("elastic", runs / "fleets")

            def joining():
                _attach_busy_job(fdir)
                return _phases(c.get("/v1/fleets/elastic").json())["rollout-1"] == "starting"

            wait_until(joining, timeout=30, what="rollout-1 starting")
        gw1.send_signal(signal.SIGKILL)  # mid scale-up: no clean stop, no last word
        gw1.wait(timeout=10)
        assert _alive(fleet_pid), "the fleet died with its gateway"
        assert json.loads(fdir.state_file.read_text())["members"]["rollout-1"]["phase"] == "starting"
        gw2, addr = _start_gateway_process(runs, env)
        try:
            with httpx.Client(base_url=addr["http"], headers=auth(), timeout=30) as c:
                first = c.get("/v1/fleets/elastic").json()
                assert first["state"] == "ready" and first["pid"] == fleet_pid, first

                def grown():
                    _attach_busy_job(fdir)
                    v = c.get("/v1/fleets/elastic").json()
                    return v if _phases(v)["rollout-1"] == "serving" else None

                got = wait_until(grown, timeout=30, what="rollout-1 serving, seen by the new gateway")
                assert got["pid"] == fleet_pid and got["scaling"]["desired"] == 2, got
                assert got["replicas"]["rollout-1"]["alive"] and got["replicas"]["rollout-1"]["ready"], got
                events = c.get("/v1/fleets/elastic/events").json()["events"]
                assert [(e["action"], e["reason"], e["replicas"], e["to"]) for e in events] == [
                    ("add", "backlog_high", ["rollout-1"], 2)], events
                # the new gateway controls the fleet it did not start: bounds, then stop
                assert c.patch("/v1/fleets/elastic", json={"max_replicas": 1}).status_code == 200
                wait_until(lambda: _phases(c.get("/v1/fleets/elastic").json())["rollout-1"] == "off", timeout=30,
                           what="rollout-1 drained on the new gateway's bounds")  # fmt: skip
                fdir.detach(JOB)
                r = c.delete("/v1/fleets/elastic")
                assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
            # not the new gateway's child: whoever adopted it reaps it; it runs no more either way
            assert wait_until(lambda: not _alive(fleet_pid), what="fleet process ended")
        finally:
            gw2.send_signal(signal.SIGTERM)
            gw2.wait(timeout=30)
    finally:
        if gw1.poll() is None:
            gw1.kill()
            gw1.wait(timeout=10)
        if fleet_pid and _alive(fleet_pid):  # a failed assertion above: end the fleet and its replicas
            os.killpg(fleet_pid, signal.SIGKILL)


# -- jobs of the gateway attach to the gateway's fleets -------------------------------------------------------------


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    from tests.fixtures.jobs import make_arith_parquet

    return make_arith_parquet(tmp_path_factory.mktemp("arith"), train_size=16)


def test_a_job_naming_a_fleet_that_never_ran_here_fails_with_the_reason(tmp_path, tiny_model, arith):
    from gateway_svc.launchers.local import LocalLauncher

    spec = {"name": "fleet-job", "model": {"path": tiny_model, "lora_rank": 8},
            "data": {"train_files": [str(arith)], "val_files": [], "train_batch_size": 4},
            "actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 2}, "trainer": {"total_steps": 1},
            "services": {"rollout": {"fleet": "nowhere"}}}  # fmt: skip
    roots = [Path(tiny_model).parent, Path(arith).parent]
    with running_gateway(tmp_path, LocalLauncher(), input_roots=roots, grpc=False) as gw:
        with httpx.Client(base_url=gw.http_url, headers=auth(), timeout=30) as c:
            r = c.post("/v1/jobs", json={"spec": spec})
            assert r.status_code == 201, r.text
            jid = r.json()["id"]
            job = wait_until(lambda: (j := c.get(f"/v1/jobs/{jid}").json())["state"] in ("failed", "succeeded") and j,
                             timeout=120, what="job finished")  # fmt: skip
    assert job["state"] == "failed", job
    assert "fleet 'nowhere' has never run here" in job["detail"], job["detail"]
    assert str(gw.fleets.root / "nowhere") in job["detail"], job["detail"]  # the gateway's fleets, not ~/.meshrl


# -- a real fleet (vLLM) through the gateway ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_a_real_fleet_starts_ready_and_stops_through_the_gateway(tmp_path, tiny_model):
    spec = {"name": "tiny", "model": {"path": tiny_model, "lora_rank": 8},
            "rollout": {"prompt_length": 32, "response_length": 8, "kv_cache_space_gib": 1, "max_num_seqs": 64},
            "replicas": 1, "max_jobs": 2}  # fmt: skip
    with running_gateway(tmp_path, fake_launcher(), input_roots=[Path(tiny_model).parent], grpc=False,
                         fleet_env={"OMP_NUM_THREADS": "1"}) as gw:  # fmt: skip
        with httpx.Client(base_url=gw.http_url, headers=auth(), timeout=30) as c:
            r = c.post("/v1/fleets", json={"spec": spec})
            assert r.status_code == 201, r.text
            log = gw.fleets.root / "tiny" / "fleet.log"

            def ready():
                got = c.get("/v1/fleets/tiny").json()
                assert got["state"] in ("starting", "ready"), (got, log.read_text()[-3000:])
                return got if got["state"] == "ready" else None

            got = wait_until(ready, timeout=420, what="fleet ready")
            replica = got["replicas"]["rollout-0"]
            assert replica["alive"] and replica["ready"] and replica["metrics"].startswith("http://"), got
            assert httpx.get(replica["metrics"] + "/health", timeout=5).status_code == 200
            r = c.delete("/v1/fleets/tiny", params={"timeout": 180})
            assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
            assert not r.json()["replicas"]["rollout-0"]["alive"]
            assert wait_until(lambda: _gone(got["pid"]), what="fleet process gone")
            assert wait_until(lambda: _gone(replica["pid"]), what="replica process gone")
