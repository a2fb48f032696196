"""A rollout replica of a fleet: one vLLM engine serving the adapters of every attached job.

``python -m rollout_svc --config VIEW --id rollout-<i> --fleet-dir DIR --adapter-slots K``
(started by ``fleet_svc``). ``VIEW`` is the fleet's rollout view: the base model, the engine,
no queues and no weight channel. The engine starts with ``K`` adapter slots; then, every
``POLL_S``, the replica looks at the jobs in the fleet's directory (:mod:`services.fleets`):

- a job that appeared (its view for this replica is there) is checked against the fleet
  (:func:`services.config.fleet.attach_problems`: base model, rank, lengths) and given an
  adapter slot (``RolloutEngine.adapter``). Then it runs what a replica of its own would
  run, on that slot: a :class:`~rollout_svc.replica.Replica` loop leasing the job's
  ``prompts`` and writing its ``rollouts`` with the job's credential, a weight subscriber
  following the job's channel into the slot, and the job's ``/health /ready /metrics`` on the
  port the job's view names. The report ``attached`` (or ``refused``, with the reason) goes
  to ``members/<replica>/<job>.json``;
- a job whose directory is gone (it finished, was cancelled or failed) is stopped like a
  replica on SIGTERM: no new leases, the groups in flight delivered (or their leases left to
  expire back to the queue), its subscriber closed, its slot released; report ``detached``.

Every ``HEARTBEAT_S`` the replica writes its own heartbeat (``members/<name>/_replica.json``,
phase ``serving``); asked to stop (SIGTERM: the fleet drains it, or an orchestrator such as a
Kubernetes HPA scales it in) it says ``draining`` before it lets its jobs go, and ``off`` as it
exits.

Jobs share the engine's batches: each job leases up to its own
``rollout.max_groups_in_flight`` groups and vLLM schedules all of them together. One job's
failure (a bad version, a broken queue) stays in its loop: its report says ``failed`` and
the others keep going.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.config.views import RolloutView

log = logging.getLogger(__name__)

POLL_S = 0.5
HEARTBEAT_S = 2.0  # the replica's own heartbeat file (services/fleets.py)


@dataclass
class Member:
    """One attached job on this replica."""

    job_id: str
    replica: Any
    adapter: Any
    http: Any
    queues: list[Any]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)
    reported_version: int | None = None


class FleetReplica:
    """The attach/detach loop of one fleet replica (see module doc)."""

    def __init__(self, view: RolloutView, name: str, fleet_dir: Path, slots: int) -> None:
        from services.config.fleet import FleetSpec
        from services.config.loader import load_model
        from services.fleets import FleetDir

        self.view, self.name, self.slots = view, name, slots
        self.fdir = FleetDir(fleet_dir.name, fleet_dir.parent)
        self.spec = load_model(FleetSpec, self.fdir.spec_file, what="fleet spec")
        self.members: dict[str, Member] = {}
        self.refused: dict[str, float] = {}  # job -> mtime of the view it refused (not tried again)
        self.engine = None

    async def serve(self, stop: asyncio.Event) -> int:
        from rollout_svc.engine import RolloutEngine
        from rollout_svc.lora import LoraServing
        from rollout_svc.metrics import RolloutMetrics
        from services.metrics import MetricsServer
        from services.readiness import announce_ready

        v = self.view
        self.engine = engine = RolloutEngine(v.rollout, v.model.path, dtype=v.model.dtype,
                                             tokenizer=v.model.tokenizer_path,
                                             trust_remote_code=v.model.trust_remote_code,
                                             lora=LoraServing.from_model_config(v.model), adapter_slots=self.slots)
        metrics = RolloutMetrics()
        http = MetricsServer(metrics.registry, host=v.resources.host, port=v.resources.metrics_port,
                             ready=lambda: engine.healthy, status=self.status).start()
        try:
            await engine.start()
            announce_ready("rollout", self.name, {"metrics": f"{http.host}:{http.port}"},
                           device=v.resources.device, dtype=engine.served_dtype(), fleet=self.spec.name)
            beat = 0.0
            while not stop.is_set() and engine.healthy:
                await self.poll()
                if time.monotonic() - beat >= HEARTBEAT_S:
                    beat = time.monotonic()
                    self.fdir.heartbeat(self.name, "serving", jobs=sorted(self.members))
                try:
                    await asyncio.wait_for(stop.wait(), timeout=POLL_S)
                except TimeoutError:
                    pass
            dead = not engine.healthy
            if dead:
                log.error("vLLM engine died; stopping the fleet replica")
            else:  # asked to stop (the fleet drains it, or an orchestrator scales in): leaving, not failing
                self.fdir.heartbeat(self.name, "draining", jobs=sorted(self.members))
            await asyncio.gather(*(self.detach(j, reason="the replica is stopping") for j in list(self.members)))
            return 1 if dead else 0
        finally:
            self.fdir.heartbeat(self.name, "off")
            engine.shutdown()
            http.stop()

    def status(self) -> dict[str, Any]:
        return {"fleet": self.spec.name, "replica": self.name, "slots": self.slots,
                "jobs": {j: m.replica.status() for j, m in self.members.items()}}

    async def poll(self) -> None:
        """Attach the jobs that appeared, detach those that left or whose loop ended."""
        wanted = {}
        for job in self.fdir.attached():
            view = self.fdir.job_view(job, self.name)
            if view.exists():
                wanted[job] = view
        for job in list(self.members):
            m = self.members[job]
            if job not in wanted:
                await self.detach(job, reason="the job left the fleet")
            elif any(t.done() for t in m.tasks):
                why = next((repr(t.exception()) for t in m.tasks if t.done() and not t.cancelled()
                            and t.exception() is not None), "its loop ended")
                await self.detach(job, reason=f"failed: {why}", state="failed")
            elif m.adapter.version != m.reported_version:  # the version it serves, for `meshrl fleet status`
                self._report_attached(m)
        for job, view in wanted.items():
            if job in self.members:
                continue
            mtime = view.stat().st_mtime
            if self.refused.get(job) == mtime:
                continue
            problem = await self.attach(job, view)
            if problem:
                self.refused[job] = mtime
                log.warning("fleet replica %s: refused job %s: %s", self.name, job, problem)
                self.fdir.report(self.name, job, "refused", detail=problem)

    async def attach(self, job: str, view_file: Path) -> str | None:
        """Start serving ``job``; its one-line refusal if it cannot be served."""
        from rollout_svc.lora import LoraServing
        from rollout_svc.metrics import RolloutMetrics
        from rollout_svc.replica import Replica
        from services import auth
        from services.config.fleet import attach_problems
        from services.config.loader import ConfigError
        from services.config.views import load_view
        from services.metrics import MetricsServer
        from services.queues import make_queue

        try:
            jv = load_view(RolloutView, view_file)
            cred = auth.JobCredential.load(str(self.fdir.job_credential(job)))
        except (ConfigError, OSError, ValueError) as exc:
            return f"unreadable view or credential: {exc}"
        problems = attach_problems(self.spec, jv)
        if problems:
            return "; ".join(problems)
        if jv.queues is None:
            return "the job's view has no queues"
        if len(self.members) >= self.slots:
            return f"all {self.slots} adapter slots of this replica are taken (fleet max_jobs)"
        try:
            adapter = await self.engine.adapter(job, LoraServing.from_model_config(jv.model), cfg=jv.rollout)
        except (ValueError, RuntimeError) as exc:  # a rank, targets or lengths the engine cannot serve; no slot
            return str(exc)
        adapter.credential_file = str(self.fdir.job_credential(job))  # what its weight channel presents
        metrics = RolloutMetrics()
        queues = [make_queue(jv.queues, stream=s, group="rollout", consumer=self.name, credential=cred)
                  for s in ("prompts", "rollouts")]
        replica = Replica(adapter, jv.rollout, name=self.name, prompts=queues[0], rollouts=queues[1], metrics=metrics)
        try:
            http = MetricsServer(metrics.registry, host=jv.resources.host, port=jv.resources.metrics_port,
                                 ready=lambda: adapter.healthy, status=replica.status).start()
        except OSError as exc:
            await self.engine.release_adapter(job)
            return f"cannot serve the job's metrics on {jv.resources.host}:{jv.resources.metrics_port}: {exc}"
        m = Member(job, replica, adapter, http, queues)
        if jv.weights is not None:
            from rollout_svc.subscriber import run_weight_subscriber

            m.tasks.append(asyncio.create_task(run_weight_subscriber(replica, jv.weights, self.name, m.stop),
                                               name=f"{job}-weights"))
            await self._catch_up(m, jv)
        m.tasks.append(asyncio.create_task(replica.run(m.stop), name=f"{job}-stream"))
        self.members[job] = m
        self._report_attached(m)
        log.info("fleet replica %s: serving job %s (metrics %s:%s)", self.name, job, http.host, http.port)
        return None

    async def _catch_up(self, m: Member, jv: RolloutView) -> None:
        """A job already past its first version (a replica joining a running job, or one the
        fleet restarted): load the job's current version before leasing, so its first
        samples are not stale. The version is the one the job's controller last wrote in
        ``load.json``; past ``weight_update_timeout_s`` it leases anyway (the trainer's
        staleness bound screens what it makes)."""
        from services.fleets import job_load
        from services.handoff import read_json

        load = job_load(read_json(self.fdir.load_file(m.job_id)))
        target = load.version if load is not None else 0
        if target <= m.adapter.version:
            return
        deadline = time.monotonic() + jv.rollout.weight_update_timeout_s
        while m.adapter.version < target and time.monotonic() < deadline and not all(t.done() for t in m.tasks):
            await asyncio.sleep(0.05)
        if m.adapter.version < target:
            log.warning("fleet replica %s: job %s is at version %d, this replica serves %d; leasing anyway",
                        self.name, m.job_id, target, m.adapter.version)
        else:
            log.info("fleet replica %s: job %s: caught up to version %d before leasing", self.name, m.job_id,
                     m.adapter.version)

    def _report_attached(self, m: Member) -> None:
        m.reported_version = m.adapter.version
        self.fdir.report(self.name, m.job_id, "attached", metrics=f"{m.http.host}:{m.http.port}",
                         served_version=m.reported_version)

    async def detach(self, job: str, *, reason: str, state: str = "detached") -> None:
        m = self.members.pop(job)
        m.stop.set()
        done, pending = await asyncio.wait(m.tasks, timeout=self.view.rollout.weight_update_timeout_s)
        for t in pending:
            t.cancel()
        for q in m.queues:
            try:
                await q.close()
            except Exception:  # noqa: BLE001 -- a broken queue of a job that left: nothing to save
                log.debug("closing a queue of job %s", job, exc_info=True)
        m.http.stop()
        await self.engine.release_adapter(job)
        self.fdir.report(self.name, job, state, detail=reason)
        log.info("fleet replica %s: job %s %s (%s)", self.name, job, state, reason)


async def serve_fleet(view: RolloutView, *, name: str, fleet_dir: str, slots: int) -> int:
    """Run a fleet replica until SIGTERM/SIGINT; the process's exit code."""
    from rollout_svc.replica_process import device_problem

    problem = device_problem(view.resources.device)
    if problem:
        print(f"rollout_svc: {problem}", flush=True)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    t0 = time.monotonic()
    code = await FleetReplica(view, name, Path(fleet_dir), slots).serve(stop)
    log.info("fleet replica %s: stopped after %.0fs", name, time.monotonic() - t0)
    return code
