"""The gateway's REST API over a real uvicorn server on loopback, running real jobs
(the stand-in driver via the LocalLauncher), jobs in SQLite."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.gateway_support import (
    TOKEN, VALID_SPEC, VALID_SPEC_YAML, auth, fake_launcher, running_gateway, wait_until,
)  # fmt: skip

pytestmark = pytest.mark.timeout(120)

#: Paths that answer without a token (probes, the dashboard's shell, the API docs and their assets).
PUBLIC = {"/health", "/ready", "/livez", "/readyz", "/healthz", "/dashboard", "/docs", "/redoc", "/openapi.json", "/",
          "/favicon.ico"}


def _routes() -> list[tuple[str, str]]:
    """Every (method, path) the REST app serves, read from the FastAPI app itself (as the gRPC
    twin reads the proto), path parameters filled; a route added later is covered at once."""
    from fastapi.routing import APIRoute

    from gateway_svc.app import create_app
    from gateway_svc.jobs import JobManager

    app = create_app(JobManager.__new__(JobManager), "route-listing-token")  # never serves: routes only
    out = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.path in PUBLIC or route.path.startswith("/static"):
            continue
        path = route.path.replace("{job_id}", "x-1").replace("{service}", "job").replace("{name}", "x")
        for method in sorted(route.methods - {"HEAD", "OPTIONS"}):
            out.append((method, path))
    return out


ROUTES = _routes()


def test_the_route_list_has_every_v1_route_and_the_events():
    paths = {p for _, p in ROUTES}
    assert {"/v1/jobs", "/v1/jobs/x-1", "/v1/jobs/x-1/metrics", "/v1/jobs/x-1/events", "/v1/jobs/x-1/logs",
            "/v1/jobs/x-1:cancel", "/v1/jobs/x-1:pause", "/v1/jobs/x-1:resume", "/metrics"} <= paths, paths
    assert {("POST", "/v1/fleets"), ("GET", "/v1/fleets"), ("GET", "/v1/fleets/x"), ("DELETE", "/v1/fleets/x"),
            ("PATCH", "/v1/fleets/x"), ("GET", "/v1/fleets/x/events")} <= set(ROUTES), ROUTES


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """One gateway for the tests that do not need a fresh one."""
    with running_gateway(tmp_path_factory.mktemp("gw"), fake_launcher(FAKE_STEPS=400, FAKE_INTERVAL=0.05)) as gw:
        yield gw


@pytest.fixture
def client(gw):
    with httpx.Client(base_url=gw.http_url, timeout=10) as c:
        yield c


@pytest.mark.parametrize("headers", [{}, auth("wrong-token"), {"Authorization": TOKEN}, {"Authorization": "Basic eA=="}])
def test_every_route_refuses_missing_or_wrong_token(client, headers):
    for method, path in ROUTES:
        r = client.request(method, path, headers=headers, json={"spec": VALID_SPEC_YAML})
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in r.json()["detail"]
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/jobs", headers=auth()).status_code == 200


def test_probes_openapi_and_dashboard_are_open(client):
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["status"] == "ready"
    schema = client.get("/openapi.json").json()
    for path in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}:cancel", "/v1/jobs/{job_id}:pause",
                 "/v1/jobs/{job_id}:resume", "/v1/jobs/{job_id}/metrics"):  # fmt: skip
        assert path in schema["paths"], path
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert "meshrl jobs" in client.get("/dashboard").text


@pytest.mark.parametrize(
    "body, field",
    [
        ({"spec": {**VALID_SPEC, "name": "UPPER"}}, "name"),
        ({"spec": {**VALID_SPEC, "data": {"train_batch_size": 4}}}, "data.train_files"),
        ({"spec": VALID_SPEC_YAML, "overrides": ["rollout.n=zero"]}, "rollout.n"),
        ({"spec": VALID_SPEC_YAML, "overrides": ["actor.nonsense=1"]}, "actor.nonsense"),
        ({"spec": "name: [oops"}, "spec"),
        ({"spec": 5}, "spec"),
        ({"spek": VALID_SPEC_YAML}, "spek"),
        ({"spec": VALID_SPEC_YAML, "overrides": "rollout.n=2"}, "overrides"),
    ],
)
def test_bad_spec_is_a_400_naming_the_field_and_stores_nothing(client, body, field):
    before = [j["id"] for j in client.get("/v1/jobs", headers=auth()).json()["jobs"]]
    r = client.post("/v1/jobs", json=body, headers=auth())
    assert r.status_code == 400, r.text
    assert field in r.json()["detail"]
    assert [j["id"] for j in client.get("/v1/jobs", headers=auth()).json()["jobs"]] == before


def test_other_bad_requests_are_4xx(client):
    assert client.post("/v1/jobs", content=b"{not json", headers={**auth(), "Content-Type": "application/json"}).status_code == 400
    assert client.post("/v1/jobs", content=b"x", headers={**auth(), "Content-Type": "image/png"}).status_code == 415
    assert client.post("/v1/jobs", content=b"\xff\xfe", headers={**auth(), "Content-Type": "application/yaml"}).status_code == 400
    assert client.get("/v1/jobs?limit=0", headers=auth()).status_code == 422
    assert client.get("/v1/jobs?state=dancing", headers=auth()).status_code == 422
    r = client.get("/v1/jobs/nope-1", headers=auth())
    assert r.status_code == 404 and "nope-1" in r.json()["detail"]
    assert client.post("/v1/jobs/nope-1:pause", headers=auth()).status_code == 404


def test_job_lifecycle_pause_resume_cancel(client):
    r = client.post("/v1/jobs", json={"spec": VALID_SPEC, "overrides": ["rollout.n=4"]}, headers=auth())
    assert r.status_code == 201, r.text
    job = r.json()
    jid = job["id"]
    assert jid.startswith("arith-test-") and job["state"] == "running" and job["overrides"] == ["rollout.n=4"]
    got = client.get(f"/v1/jobs/{jid}", headers=auth()).json()
    assert "n: 4" in got["spec"]
    wait_until(lambda: client.get(f"/v1/jobs/{jid}", headers=auth()).json()["progress"].get("step"), what="progress")

    assert client.post(f"/v1/jobs/{jid}:resume", headers=auth()).status_code == 409  # not paused
    r = client.post(f"/v1/jobs/{jid}:pause", headers=auth())
    assert r.status_code == 200 and r.json()["state"] == "paused"
    assert client.get("/v1/jobs?state=paused", headers=auth()).json()["jobs"][0]["id"] == jid
    r = client.post(f"/v1/jobs/{jid}:resume", headers=auth())
    assert r.status_code == 200 and r.json()["state"] == "running"

    m = wait_until(lambda: (m := client.get(f"/v1/jobs/{jid}/metrics", headers=auth()).json()) and len(m["points"]) >= 2 and m, what="points")
    steps = [p["step"] for p in m["points"]]
    assert steps == sorted(steps) and m["points"][-1]["queues"]["rollouts"] == 1
    newer = client.get(f"/v1/jobs/{jid}/metrics", params={"since": m["points"][-1]["ts"]}, headers=auth()).json()
    assert all(p["ts"] > m["points"][-1]["ts"] for p in newer["points"])

    r = client.post(f"/v1/jobs/{jid}:cancel", headers=auth())
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert client.post(f"/v1/jobs/{jid}:cancel", headers=auth()).status_code == 409
    assert client.post(f"/v1/jobs/{jid}:pause", headers=auth()).status_code == 409
    assert 'meshrl_gateway_jobs{state="cancelled"} 1.0' in client.get("/metrics", headers=auth()).text


def test_yaml_body_with_override_query_runs_to_completion(tmp_path):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=3, FAKE_INTERVAL=0.02)) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        r = c.post("/v1/jobs", params=[("override", "rollout.n=3")], content=VALID_SPEC_YAML.encode(),
                   headers={**auth(), "Content-Type": "application/yaml"})  # fmt: skip
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        done = wait_until(lambda: (j := c.get(f"/v1/jobs/{jid}", headers=auth()).json())["state"] == "succeeded" and j,
                          what="success")  # fmt: skip
        assert done["exit_code"] == 0 and done["progress"]["step"] == 3 and done["overrides"] == ["rollout.n=3"]


def test_failed_job_says_why(tmp_path):
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=1, FAKE_INTERVAL=0.01, FAKE_EXIT=2)) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        jid = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        job = wait_until(lambda: (j := c.get(f"/v1/jobs/{jid}", headers=auth()).json())["state"] == "failed" and j,
                         what="failure")  # fmt: skip
        assert job["exit_code"] == 2 and "trainer crashed: boom" in job["detail"]


def test_jobs_survive_a_gateway_restart(tmp_path):
    launcher = fake_launcher(FAKE_STEPS=3, FAKE_INTERVAL=0.02)
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
        jid = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        wait_until(lambda: c.get(f"/v1/jobs/{jid}", headers=auth()).json()["state"] == "succeeded", what="success")
    with running_gateway(tmp_path, launcher) as gw, httpx.Client(base_url=gw.http_url, timeout=10) as c:
        jobs = c.get("/v1/jobs", headers=auth()).json()["jobs"]
        assert [(j["id"], j["state"]) for j in jobs] == [(jid, "succeeded")]


def test_garbage_in_status_json_never_breaks_the_api(tmp_path):
    """A driver writing NaN, wrong types or a huge detail still gives 200s with clean fields."""
    with running_gateway(tmp_path, fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.05, FAKE_GARBAGE=1)) as gw, \
            httpx.Client(base_url=gw.http_url, timeout=10) as c:  # fmt: skip
        jid = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
        wait_until(lambda: len(c.get(f"/v1/jobs/{jid}", headers=auth()).json()["detail"]) > 0, what="a detail")
        for path in (f"/v1/jobs/{jid}", "/v1/jobs", f"/v1/jobs/{jid}/metrics"):
            r = c.get(path, headers=auth())
            assert r.status_code == 200, (path, r.text[:300])
        job = c.get(f"/v1/jobs/{jid}", headers=auth()).json()
        assert len(job["detail"]) <= 4000
        assert all(v is None for v in job["progress"].values())
        assert c.post(f"/v1/jobs/{jid}:cancel", headers=auth()).status_code == 200


def test_oversized_body_is_a_413(client):
    big = b"name: x\n" + b"#" * (2 << 20)
    r = client.post("/v1/jobs", content=big, headers={**auth(), "Content-Type": "application/yaml"})
    assert r.status_code == 413 and "bytes" in r.json()["detail"]
