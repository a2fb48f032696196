"""The gRPC JobService over a real server on loopback."""

from __future__ import annotations

import grpc
import pytest

from services.pb import job_pb2, job_pb2_grpc
from tests.integration.gateway_support import TOKEN, VALID_SPEC_YAML, fake_launcher, running_gateway, wait_until

pytestmark = pytest.mark.timeout(120)
META = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    with running_gateway(tmp_path_factory.mktemp("grpc"), fake_launcher(FAKE_STEPS=400, FAKE_INTERVAL=0.05)) as gw:
        with grpc.insecure_channel(gw.grpc_address) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
            yield job_pb2_grpc.JobServiceStub(channel)


def _code(fn, request, metadata=META):
    with pytest.raises(grpc.RpcError) as err:
        reply = fn(request, metadata=metadata, timeout=10)
        if hasattr(reply, "__next__"):  # a server stream: the status comes with the first read
            list(reply)
    return err.value.code(), err.value.details()


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer nope"),), (("authorization", TOKEN),)])
def test_every_rpc_refuses_missing_or_wrong_token(stub, metadata):
    methods = job_pb2.DESCRIPTOR.services_by_name["JobService"].methods
    assert {m.name for m in methods} >= {"SubmitJob", "GetJobEvents", "GetJobLogs", "StartFleet", "ListFleets",
                                         "GetFleet", "StopFleet", "ScaleFleet", "GetFleetEvents"}
    for method in methods:  # every RPC the proto declares, so a new one cannot be left open
        request_cls = getattr(job_pb2, method.input_type.name)
        request = request_cls(spec_yaml=VALID_SPEC_YAML) if method.name == "SubmitJob" else request_cls()
        if "id" in request_cls.DESCRIPTOR.fields_by_name:
            request.id = "x"
        code, details = _code(getattr(stub, method.name), request, metadata)
        assert code is grpc.StatusCode.UNAUTHENTICATED, (method.name, details)


def test_bad_input_maps_to_clear_status_codes(stub):
    code, details = _code(stub.SubmitJob, job_pb2.JobSubmitRequest(spec_yaml=VALID_SPEC_YAML, overrides=["rollout.n=-1"]))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "rollout.n" in details
    code, details = _code(stub.SubmitJob, job_pb2.JobSubmitRequest(spec_yaml="- not a mapping"))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "spec" in details
    assert _code(stub.GetJob, job_pb2.JobIdRequest(id="missing-1"))[0] is grpc.StatusCode.NOT_FOUND
    assert _code(stub.ListJobs, job_pb2.JobListRequest(state="dancing"))[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.ListJobs, job_pb2.JobListRequest(limit=5000))[0] is grpc.StatusCode.INVALID_ARGUMENT
    nan = job_pb2.JobMetricsRequest(id="x", since=float("nan"))
    assert _code(stub.GetJobMetrics, nan)[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.GetJobEvents, job_pb2.JobEventsRequest(id="x", since=float("nan")))[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.GetJobEvents, job_pb2.JobEventsRequest(id="x", limit=20_000))[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.GetJobEvents, job_pb2.JobEventsRequest(id="missing-1"))[0] is grpc.StatusCode.NOT_FOUND
    assert _code(stub.GetJobLogs, job_pb2.JobLogsRequest(id="x", tail=20_000))[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.GetJobLogs, job_pb2.JobLogsRequest(id="x", max_seconds=-1))[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.GetJobLogs, job_pb2.JobLogsRequest(id="x", max_seconds=float("nan")))[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert _code(stub.GetJobLogs, job_pb2.JobLogsRequest(id="missing-1"))[0] is grpc.StatusCode.NOT_FOUND


def test_job_lifecycle_over_grpc(stub):
    job = stub.SubmitJob(job_pb2.JobSubmitRequest(spec_yaml=VALID_SPEC_YAML, overrides=["rollout.n=4"]),
                         metadata=META, timeout=10)  # fmt: skip
    assert job.state == "running" and list(job.overrides) == ["rollout.n=4"] and not job.HasField("exit_code")
    got = stub.GetJob(job_pb2.JobIdRequest(id=job.id), metadata=META, timeout=10)
    assert "n: 4" in got.spec_yaml
    wait_until(lambda: stub.GetJob(job_pb2.JobIdRequest(id=job.id), metadata=META, timeout=10).progress.HasField("step"))
    assert stub.PauseJob(job_pb2.JobIdRequest(id=job.id), metadata=META, timeout=10).state == "paused"
    assert _code(stub.PauseJob, job_pb2.JobIdRequest(id=job.id))[0] is grpc.StatusCode.FAILED_PRECONDITION
    assert stub.ResumeJob(job_pb2.JobIdRequest(id=job.id), metadata=META, timeout=10).state == "running"
    metrics = wait_until(
        lambda: (m := stub.GetJobMetrics(job_pb2.JobMetricsRequest(id=job.id), metadata=META, timeout=10))
        and len(m.points) >= 2 and m
    )
    assert metrics.points[-1].progress.queues["rollouts"] == 1 and metrics.points[-1].progress.reward_mean > 0
    listed = stub.ListJobs(job_pb2.JobListRequest(state="running"), metadata=META, timeout=10)
    assert job.id in [j.id for j in listed.jobs]
    assert stub.CancelJob(job_pb2.JobIdRequest(id=job.id), metadata=META, timeout=10).state == "cancelled"
    assert _code(stub.CancelJob, job_pb2.JobIdRequest(id=job.id))[0] is grpc.StatusCode.FAILED_PRECONDITION
