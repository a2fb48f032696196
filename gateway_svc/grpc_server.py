"""The gateway's gRPC ``JobService`` (proto/job.proto) over the same :class:`JobManager`.

    server = start_grpc(manager, token, host="127.0.0.1", port=0)   # -> (grpc.Server, bound port)

Auth is the metadata ``authorization: Bearer <token>`` (constant-time compare); errors map
to status codes: UNAUTHENTICATED, INVALID_ARGUMENT (bad spec, names the fields), NOT_FOUND,
FAILED_PRECONDITION (state does not allow it). The fleet methods (StartFleet, ListFleets,
GetFleet, ScaleFleet, GetFleetEvents, StopFleet) go to the gateway's
:class:`~gateway_svc.fleets.FleetManager`.
"""

from __future__ import annotations

import hmac
import logging
import time
from concurrent import futures
from typing import Any, Callable

import grpc

from gateway_svc.fleets import FleetConflict, FleetLaunchError, FleetManager, FleetNotFound, FleetStillStopping
from gateway_svc.jobs import JobConflict, JobManager, JobNotFound, job_to_dict
from gateway_svc.logs import MAX_TAIL_LINES, UnknownLog
from gateway_svc.spec_validation import SpecRejected
from gateway_svc.launchers.base import JobState
from services.pb import job_pb2, job_pb2_grpc

_STATES = {s.value for s in JobState}
_PROGRESS_INT = ("step", "total_steps")
_PROGRESS_FLOAT = ("reward_mean", "staleness", "tokens_per_s", "loss", "kl", "entropy", "grad_norm", "val_score",
                   "logprob_diff")  # fmt: skip


def progress_msg(progress: dict[str, Any]) -> job_pb2.JobProgressInfo:
    """status.json progress -> JobProgressInfo (fields of the wrong type are left out)."""
    msg = job_pb2.JobProgressInfo()
    for key in _PROGRESS_INT:
        if isinstance(progress.get(key), int) and not isinstance(progress.get(key), bool):
            setattr(msg, key, progress[key])
    for key in _PROGRESS_FLOAT:
        if isinstance(progress.get(key), (int, float)) and not isinstance(progress.get(key), bool):
            setattr(msg, key, float(progress[key]))
    if isinstance(progress.get("stalled"), bool):
        msg.stalled = progress["stalled"]
    for key in ("queues", "restarts", "ledger", "ledger_stages"):
        counts = progress.get(key)
        if isinstance(counts, dict):
            for name, n in counts.items():
                if isinstance(n, int) and not isinstance(n, bool):
                    getattr(msg, key)[str(name)] = n
    if isinstance(progress.get("weights"), dict):
        weights_msg(progress["weights"], msg.weights)
    return msg


def weights_msg(w: dict[str, Any], msg: job_pb2.JobWeights) -> None:
    """progress ``weights`` (as ``clean_weights`` keeps it) -> JobWeights ``msg``."""
    msg.mode = w.get("mode", "")
    for key in ("promoted", "candidate"):
        if w.get(key) is not None:
            setattr(msg, key, w[key])
    msg.paused = w.get("paused") or ""
    for name, r in (w.get("replicas") or {}).items():
        msg.replicas[name].role = r["role"]
        if r.get("served_version") is not None:
            msg.replicas[name].served_version = r["served_version"]
    for e in w.get("events") or []:
        msg.events.add(ts=e["ts"], version=e["version"], kind=e["kind"], reason=e["reason"],
                       measurements=e["measurements"])


def job_msg(job: dict[str, Any]) -> job_pb2.JobInfo:
    msg = job_pb2.JobInfo(
        id=job["id"], name=job["name"], state=job["state"], detail=job["detail"], launcher=job["launcher"],
        overrides=job["overrides"], created_at=job["created_at"], updated_at=job["updated_at"],
        progress=progress_msg(job["progress"]), spec_yaml=job.get("spec") or "",
    )  # fmt: skip
    if job["exit_code"] is not None:
        msg.exit_code = job["exit_code"]
    return msg


def fleet_msg(fleet: dict[str, Any]) -> job_pb2.FleetInfo:
    """A fleet's public view (gateway_svc/fleets.py) -> FleetInfo."""
    msg = job_pb2.FleetInfo(name=fleet["name"], state=fleet["state"], detail=fleet.get("detail") or "",
                            model=fleet.get("model") or "", spec_yaml=fleet.get("spec") or "")  # fmt: skip
    for key in ("pid", "max_jobs", "max_lora_rank", "started_at", "updated_at"):
        if fleet.get(key) is not None:
            setattr(msg, key, fleet[key])
    msg.metrics = fleet.get("metrics") or ""
    for name, r in fleet.get("replicas", {}).items():
        rep = msg.replicas[name]
        rep.alive, rep.ready, rep.restarts, rep.metrics = r["alive"], r["ready"], r["restarts"], r["metrics"] or ""
        rep.phase = r.get("phase") or ""
        if r.get("pid") is not None:
            rep.pid = r["pid"]
    sc = fleet.get("scaling")
    if sc is not None:
        msg.scaling.SetInParent()
        for key in ("min", "max", "desired"):
            if sc.get(key) is not None:
                setattr(msg.scaling, key, sc[key])
        msg.scaling.policy = sc.get("policy") or ""
        msg.scaling.signals.update(sc.get("signals") or {})
        if sc.get("requested"):
            msg.scaling.requested.min, msg.scaling.requested.max = sc["requested"]["min"], sc["requested"]["max"]
    for job, reports in fleet.get("jobs", {}).items():
        for name, r in reports.items():
            rep = msg.jobs[job].replicas[name]
            rep.state, rep.detail, rep.metrics = r["state"], r["detail"], r["metrics"] or ""
            for key in ("served_version", "pid", "time"):
                if r.get(key) is not None:
                    setattr(rep, key, r[key])
    return msg


def fleet_event_msg(e: dict[str, Any]) -> job_pb2.FleetEvent:
    """One scaling decision (FleetManager.events) -> FleetEvent."""
    msg = job_pb2.FleetEvent(ts=e["ts"], action=e["action"], reason=e["reason"], replicas=e["replicas"],
                             signals=e["signals"])  # fmt: skip
    if e.get("from") is not None:
        msg.from_replicas = e["from"]
    if e.get("to") is not None:
        msg.to_replicas = e["to"]
    return msg


class JobServicer(job_pb2_grpc.JobServiceServicer):
    """Implements JobService; every method checks the token first."""

    def __init__(self, manager: JobManager, token: str, fleets: FleetManager | None = None) -> None:
        if not token:
            raise ValueError("the gateway needs a non-empty token")
        self.manager = manager
        self.fleets = fleets
        self._expected = token.encode()

    def _check(self, context: grpc.ServicerContext) -> None:
        given = b""
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                given = value[len("Bearer ") :].encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(given, self._expected):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token (metadata authorization)")

    def _call(self, context: grpc.ServicerContext, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        self._check(context)
        try:
            return fn(*args, **kw)
        except SpecRejected as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except JobNotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except JobConflict as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except UnknownLog as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except FleetNotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except FleetConflict as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except FleetLaunchError as exc:
            context.abort(grpc.StatusCode.INTERNAL, str(exc))

    def _fleets(self, context: grpc.ServicerContext) -> FleetManager:
        """The token checked, the gateway's fleets (NOT_FOUND on a gateway without them)."""
        self._check(context)
        if self.fleets is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "this gateway runs no fleets")
        return self.fleets  # type: ignore[return-value]

    def SubmitJob(self, request, context):  # noqa: N802 (gRPC names)
        row = self._call(context, self.manager.submit, request.spec_yaml, list(request.overrides))
        return job_msg(job_to_dict(row))

    def ListJobs(self, request, context):  # noqa: N802
        self._check(context)
        if request.state and request.state not in _STATES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"state: expected one of {sorted(_STATES)}")
        if request.limit > 1000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: at most 1000")
        rows = self._call(
            context, self.manager.list, state=request.state or None, limit=request.limit or 100, offset=request.offset
        )
        return job_pb2.JobListReply(jobs=[job_msg(job_to_dict(r)) for r in rows])

    def GetJob(self, request, context):  # noqa: N802
        return job_msg(job_to_dict(self._call(context, self.manager.get, request.id), with_spec=True))

    def CancelJob(self, request, context):  # noqa: N802
        return job_msg(job_to_dict(self._call(context, self.manager.cancel, request.id)))

    def PauseJob(self, request, context):  # noqa: N802
        return job_msg(job_to_dict(self._call(context, self.manager.pause, request.id)))

    def ResumeJob(self, request, context):  # noqa: N802
        return job_msg(job_to_dict(self._call(context, self.manager.resume, request.id)))

    def GetJobMetrics(self, request, context):  # noqa: N802
        if not (0.0 <= request.since <= 1e12):  # also refuses NaN
            self._check(context)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "since: a unix time between 0 and 1e12")
        m = self._call(context, self.manager.metrics, request.id, since=request.since)
        points = [
            job_pb2.JobMetricPoint(ts=p["ts"], progress=progress_msg({k: v for k, v in p.items() if k != "ts"}))
            for p in m["points"]
        ]
        return job_pb2.JobMetricsReply(id=m["id"], state=m["state"], progress=progress_msg(m["progress"]), points=points)

    def GetJobEvents(self, request, context):  # noqa: N802
        self._check(context)
        if not (0.0 <= request.since <= 1e12):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "since: a unix time between 0 and 1e12")
        if request.limit > 10_000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: at most 10000")
        e = self._call(context, self.manager.events, request.id, since=request.since, limit=request.limit or 1000)
        return job_pb2.JobEventsReply(id=e["id"], state=e["state"],
                                      events=[job_pb2.JobEvent(**ev) for ev in e["events"]])  # fmt: skip

    def GetJobLogs(self, request, context):  # noqa: N802
        self._check(context)
        if request.tail > MAX_TAIL_LINES:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"tail: at most {MAX_TAIL_LINES} lines")
        if not (0.0 <= request.max_seconds <= 3600):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_seconds: between 0 and 3600")
        chunks = self._call(
            context, self.manager.logs, request.id, request.service or "job",
            tail=request.tail if request.HasField("tail") else 200, follow=request.follow,
            max_seconds=request.max_seconds or 30.0,
        )  # fmt: skip
        for data in chunks:  # empty chunks are ticks of an idle follow
            if not context.is_active():  # the client went away
                return
            if data:
                yield job_pb2.JobLogChunk(data=data)


    def StartFleet(self, request, context):  # noqa: N802
        fleets = self._fleets(context)
        return fleet_msg(self._call(context, fleets.start, request.spec_yaml, list(request.overrides)))

    def ListFleets(self, request, context):  # noqa: N802
        fleets = self._fleets(context)
        return job_pb2.FleetListReply(fleets=[fleet_msg(f) for f in self._call(context, fleets.list)])

    def GetFleet(self, request, context):  # noqa: N802
        fleets = self._fleets(context)
        return fleet_msg(self._call(context, fleets.get, request.name, with_spec=True))

    def ScaleFleet(self, request, context):  # noqa: N802
        fleets = self._fleets(context)
        lo = request.min_replicas if request.HasField("min_replicas") else None
        hi = request.max_replicas if request.HasField("max_replicas") else None
        if lo is None and hi is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "min_replicas, max_replicas: give one or both")
        return fleet_msg(self._call(context, fleets.scale, request.name, lo, hi))

    def GetFleetEvents(self, request, context):  # noqa: N802
        fleets = self._fleets(context)
        if not (0.0 <= request.since <= 1e12):  # also refuses NaN
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "since: a unix time between 0 and 1e12")
        if request.limit > 10_000:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "limit: at most 10000")
        e = self._call(context, fleets.events, request.name, since=request.since, limit=request.limit or 1000)
        return job_pb2.FleetEventsReply(name=e["name"], state=e["state"],
                                        events=[fleet_event_msg(ev) for ev in e["events"]])  # fmt: skip

    def StopFleet(self, request, context):  # noqa: N802
        fleets = self._fleets(context)
        if not (0.0 <= request.timeout_s <= 600):  # also refuses NaN
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "timeout_s: between 0 and 600")
        try:
            view = self._call(context, fleets.stop, request.name, timeout=request.timeout_s or 60.0)
        except FleetStillStopping as exc:  # asked to stop, not stopped yet: the reply says "stopping"
            view = exc.view
        return fleet_msg(view)


class AccessLog(grpc.ServerInterceptor):
    """One access-log line per call: peer, method, status code, milliseconds (never the request)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001 (gRPC API)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        def line(context: grpc.ServicerContext, t0: float, failed: bool) -> None:
            code = context.code() or (grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK)
            name = code.name if isinstance(code, grpc.StatusCode) else str(code)
            self._write(f'{context.peer()} "GRPC {method}" {name} {(time.perf_counter() - t0) * 1000:.1f}ms')

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request, context):  # noqa: ANN001
                t0, failed = time.perf_counter(), True
                try:
                    reply = inner(request, context)
                    failed = False
                    return reply
                finally:
                    line(context, t0, failed)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request, context):  # noqa: ANN001
                t0, failed = time.perf_counter(), True
                try:
                    yield from inner_stream(request, context)
                    failed = False
                finally:
                    line(context, t0, failed)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
            )
        return handler


def start_grpc(
    manager: JobManager, token: str, *, host: str = "127.0.0.1", port: int = 0, workers: int = 8,
    access_log: Callable[[str], None] | None = None, fleets: FleetManager | None = None,
) -> tuple[grpc.Server, int]:
    """Start a JobService server; return it and the bound port. ``access_log`` gets one line per
    call; ``fleets``: the gateway's fleets (without it the fleet methods answer NOT_FOUND)."""
    log = logging.getLogger("meshrl.gateway.access")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jobservice"),
                         interceptors=[AccessLog(access_log or log.info)],
                         options=[("grpc.so_reuseport", 0)])  # never share a port silently
    job_pb2_grpc.add_JobServiceServicer_to_server(JobServicer(manager, token, fleets), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the JobService to {host}:{port}")
    server.start()
    return server, bound


__all__ = ["AccessLog", "JobServicer", "start_grpc"]
