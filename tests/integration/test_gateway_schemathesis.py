"""Property-based API fuzzing with schemathesis against the gateway's published OpenAPI
schema, on a real server on loopback: whatever the request, never a 5xx.

Bounded: a fixed number of examples per operation and generation mode, no example
database, so the test costs a few seconds and is reproducible (derandomized).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.integration.gateway_support import VALID_SPEC, auth, fake_launcher, running_gateway

pytestmark = pytest.mark.timeout(300)
EXAMPLES = 15


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("fuzz"), fake_launcher(FAKE_STEPS=10_000, FAKE_INTERVAL=0.2),
                         grpc=False) as gw:  # fmt: skip
        yield gw


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_no_request_gets_a_server_error(gateway, mode):
    import httpx

    # One real job, so generated ids sometimes hit it via the explicit path below.
    with httpx.Client(base_url=gateway.http_url, timeout=10) as c:
        job_id = c.post("/v1/jobs", json={"spec": VALID_SPEC}, headers=auth()).json()["id"]
    schema = schemathesis.openapi.from_url(gateway.http_url + "/openapi.json", wait_for_schema=10)
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 13
    assert {"/v1/jobs/{job_id}/logs", "/v1/jobs/{job_id}/events"} <= {op.path for op in operations}
    seen: dict[str, set[int]] = {}
    for op in operations:
        strategies = [op.as_strategy(mode)]
        if "{job_id}" in op.path:
            # The real job runs for a long time: a followed log of it is bounded to 1 s, so a
            # request never waits on the stream (every other parameter is still generated).
            fixed = {"query": {"max_seconds": 1}} if op.path.endswith("/logs") else {}
            strategies.append(op.as_strategy(mode, path_parameters={"job_id": job_id}, **fixed))
        for strategy in strategies:

            @given(case=strategy)
            @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))  # fmt: skip
            def check(case):
                r = case.call(base_url=gateway.http_url, headers=auth(), timeout=15)
                seen.setdefault(f"{op.method.upper()} {op.path}", set()).add(r.status_code)
                assert r.status_code < 500, f"{case.as_curl_command()} -> {r.status_code} {r.text[:500]}"

            try:
                check()
            except Unsatisfiable:  # nothing invalid to send (an operation without inputs)
                assert mode is schemathesis.GenerationMode.NEGATIVE, op.path
    print(f"{mode.value}: " + "; ".join(f"{k} -> {sorted(v)}" for k, v in sorted(seen.items())))
    # The fuzzer reached every operation (with inputs, in negative mode), and some requests were refused.
    if mode is schemathesis.GenerationMode.POSITIVE:
        assert len(seen) == len(operations)
    else:
        assert {"POST /v1/jobs", "GET /v1/jobs", "GET /v1/jobs/{job_id}/metrics", "GET /v1/jobs/{job_id}/logs",
                "GET /v1/jobs/{job_id}/events"} <= set(seen)  # fmt: skip
    assert any(400 <= code < 500 for codes in seen.values() for code in codes)
