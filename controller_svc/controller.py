"""The job controller behind ``meshrl run``: one job on this machine.

It hosts the embedded queue broker (when ``queues.type == "embedded"``,
:mod:`controller_svc.broker_host`), starts the job's services and supervises them
(:mod:`controller_svc.mesh`: the trainer, the reward workers, the rollout replicas, then
the prompt feeder ``feeder_svc``), runs the validation rounds and loggers
(:mod:`controller_svc.run_tracking`), follows the job's progress in the sample ledger
(:mod:`services.ledger`) and shows it (:mod:`controller_svc.job_status`: a bar on
stderr, ``<run_dir>/status.json``, its own ``/metrics``; at the end ``summary.json`` and PNG
plots). The job fails only when a service exhausts its restart budget or the job stalls
past its deadline (saying which and why). SIGTERM / Ctrl-C stops every service at once (the
trainer acks and checkpoints the step in progress); the trainer finishing
``trainer.total_steps`` ends the job. Running the same command on the same run dir resumes
it: the broker's file, the feeder's position (``feeder.json``) and the trainer's checkpoint
agree.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

from services import auth
from services.data.feed_position import fed_count, fed_uids_of
from controller_svc.broker_host import BrokerThread
from controller_svc.fleet_attach import feed_early, trainer_wait_s, write_load
from controller_svc.job_status import StatusBoard
from services.ledger import Ledger, audit
from controller_svc.mesh import ServiceMesh
from services.procs import ServiceFailed, become_subreaper
from controller_svc.report import History
from services.supervision import Supervisor, stall_reason
from services.metrics.scrape import http_get, parse_metrics
from services.net import free_port

log = logging.getLogger("meshrl.run")

#: The streams whose depths the controller watches (stall detection), with their consumer groups.
WATCHED = (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))

#: Seconds between two observations of the job (every service's ``/metrics``, which is also its
#: heartbeat, the queue depths, the ledger, ``status.json``). Nothing waits on them: restarts
#: follow a process's exit (checked every ``poll_s``), new steps and validation rounds the
#: trainer's step file (stat'ed every ``poll_s``); heartbeat and stall deadlines are a minute.
OBSERVE_S = 2.0


class JobController:
    """Runs ``spec`` (a validated JobSpec) with its files under ``run_dir``."""

    def __init__(self, spec: Any, run_dir: str | Path, *, progress: bool = True, poll_s: float = 0.5,
                 observe_s: float = OBSERVE_S) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir).resolve()
        self.progress = progress
        self.poll_s = poll_s
        self.observe_s = max(poll_s, observe_s)
        self.history = History(self.run_dir / "trainer_metrics.jsonl")
        self.sup = Supervisor(spec.services.restart, [])
        self.ledger = Ledger(self.run_dir, spec.rollout.n)
        self.fed_before = 0  # prompts a resumed job had fed before this run
        self.credential_file = self.run_dir / auth.FILE_NAME
        self.credential: auth.JobCredential | None = None
        self.mesh = ServiceMesh(spec, self.run_dir, self.sup, credential_file=self.credential_file,
                                metrics_file=self.history.metrics_file, log_line=self._log)
        self.board = StatusBoard(spec, self.run_dir, self.history, self.ledger, self.sup, self.mesh)
        self.tracking = None  # loggers + validation rounds (controller_svc.run_tracking)
        self.broker_port = 0
        self._broker: BrokerThread | None = None
        self._scrapes: dict[str, dict[str, float]] = {}  # the last /metrics of each live service
        self._trainer_wait: float | None = None  # a job on a fleet: its trainer's seconds waiting for samples
        self._stop_signal: int | None = None

    @property
    def max_in_flight(self) -> int:
        """The feeder's admission bound (its view says how it is computed)."""
        return self.mesh.views["feeder"].max_in_flight

    def _stopped(self) -> bool:
        return self._stop_signal is not None

    # ------------------------------------------------------------------ main

    def run(self) -> int:
        """Run the job to the end; returns the exit code (0 done, 1 failed, 130 interrupted)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        become_subreaper()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        code = 1
        board = self.board
        try:
            code = asyncio.run(self._main())
            return code
        except BaseException as exc:  # the final state always reaches status.json
            if board.state not in ("failed", "cancelled"):
                board.state, board.detail = "failed", f"controller error: {type(exc).__name__}: {exc}"
                self._log(f"meshrl run: {board.detail}")
            raise
        finally:
            self.mesh.stop_all()
            if self.mesh.placement is not None:
                self.mesh.placement.release()
            if board.state in ("pending", "starting", "running"):
                board.state = "failed" if code else board.state
                board.detail = board.detail or "the controller stopped unexpectedly"
            board.write()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    def _cancelled(self) -> int:
        self.board.state, self.board.detail = "cancelled", f"stopped by signal {self._stop_signal}"
        return 130

    async def _main(self) -> int:
        spec, board, mesh = self.spec, self.board, self.mesh
        broker = None
        self.credential = auth.JobCredential.generate()  # this run's own secret, handed to every service
        self.credential.write(self.credential_file)
        self.broker_port = free_port(spec.services.host)
        if spec.queues.type == "embedded":
            broker = self._broker = await asyncio.to_thread(BrokerThread(spec.services.host, self.broker_port,
                                                                         self.run_dir / "broker.aof",
                                                                         self.credential).start)
        server = board.start_metrics()
        try:
            if spec.services.launcher == "ray":
                from services.ray_launcher.placement import RayPlacement, instance_names

                mesh.placement = RayPlacement(spec, instance_names(spec))
                await asyncio.to_thread(mesh.placement.connect)
            self.fed_before = fed_count(self.run_dir / "feeder.json")  # (a job on a fleet feeds before _loop)
            configs = mesh.write_views(f"{self._broker_host()}:{self.broker_port}")
            feeder = mesh.early_feeder_view()
            if feeder is not None:  # started with the others, feeding once released (start_feeder)
                configs["feeder"] = feeder
            board.state = "starting"
            board.write()
            if mesh.placement is not None:
                self._log(f"meshrl run: Ray cluster at {mesh.placement.address}; placing {len(configs)} services "
                          f"(strategy {spec.services.ray.strategy})")
                await asyncio.to_thread(mesh.placement.reserve, self._stopped)
            # the loggers and the validation set load while the services start
            prompts = self._open_queue("prompts", "controller")  # validation rounds are put here
            tracking = asyncio.create_task(self._start_tracking(prompts))
            await asyncio.gather(mesh.start(configs, self._stopped), tracking,
                                 feed_early(mesh, spec, tracking, self._stopped, self._log))
            board.write()
            if self._stopped():
                await prompts.close()
                return self._cancelled()
            board.state = "running"
            return await self._loop(prompts)
        except ServiceFailed as exc:
            board.state, board.detail = "failed", str(exc)
            self._log(f"meshrl run: {exc}")
            return 1
        finally:
            if self.tracking is not None:  # the services never all came up
                tracking, self.tracking = self.tracking, None
                await tracking.finish(succeeded=False)
            mesh.cancel_restarts()
            # Off the event loop: it hosts the embedded broker, which the trainer needs to
            # reach while it acks and checkpoints the step in progress.
            await asyncio.to_thread(mesh.stop_all)
            await self._final_audit()
            await self._broker_ledger()
            if broker is not None:
                await asyncio.to_thread(broker.stop)
            server.stop()

    def _broker_host(self) -> str:
        """Where services reach the embedded broker: ``services.host``; for Ray actors on
        other nodes a wildcard bind (0.0.0.0) is advertised as this machine's Ray node IP."""
        host = self.spec.services.host
        if self.mesh.placement is not None and host in ("0.0.0.0", "::"):
            return self.mesh.placement.ray.util.get_node_ip_address()
        return host

    def _queue_credential(self):
        return self.credential if self.spec.queues.type == "embedded" else None

    def _queue_cfg(self):
        cfg = self.spec.queues
        if cfg.type == "embedded":
            cfg = cfg.model_copy(update={"address": f"{self.spec.services.host}:{self.broker_port}"})
        return cfg

    def _open_queue(self, stream: str, group: str):
        from services.queues import make_queue

        return make_queue(self._queue_cfg(), stream=stream, group=group, consumer="controller",
                          metrics=self.board.control.queues, credential=self._queue_credential())

    async def _start_tracking(self, prompts) -> None:
        """The loggers and the validation rounds; the first round (``val_before_train``) is
        queued here, before the feeder is let go (:meth:`ServiceMesh.start_feeder`), so it
        comes before any training prompt."""
        from controller_svc.run_tracking import RunTracking

        self.tracking = RunTracking(self.spec, self.run_dir, self.history, log=self._log)
        await self.tracking.start(prompts, self._open_queue)

    async def _loop(self, prompts) -> int:
        spec, board, mesh = self.spec, self.board, self.mesh
        watched = {name: self._open_queue(name, group) for name, group in WATCHED}
        self._read_fed()
        if self.fed_before:
            self._log(f"resuming: {self.fed_before} prompts fed before")
        bar = self._progress_bar()
        try:
            await mesh.start_feeder(self._stopped)
            self.sup.touch(time.monotonic())
            observed_at = 0.0
            while True:
                if self._stopped():
                    self._log("meshrl run: interrupted; stopping the services (the trainer checkpoints first); "
                              f"resume with the same command and --run-dir {self.run_dir}")
                    return self._cancelled()
                trainer = mesh.proc("trainer")
                if trainer.returncode == 0 and "trainer" not in mesh.restarting:
                    await self._observe(bar)  # the lines it wrote just before exiting
                    last = max((r["step"] for r in self.history.steps), default=0)
                    if last >= spec.trainer.total_steps:
                        tracking, self.tracking = self.tracking, None
                        await tracking.finish(succeeded=True)  # the last validation round, while replicas run
                        board.state, board.detail = "succeeded", f"trained {spec.trainer.total_steps} steps"
                        return 0
                    trainer.kill_reason = f"stopped at step {last} of {spec.trainer.total_steps}"
                mesh.follow_fleet()
                mesh.supervise(self._stopped, on_exit=self._on_exit)
                if time.monotonic() - observed_at >= self.observe_s:
                    observed_at = time.monotonic()
                    await self._observe(bar)
                    self._read_fed()
                    await self._broker_ledger()
                    board.queues = await self._depths(watched)
                    if mesh.attachment is not None:  # a job on a fleet: its load, what the fleet scales on
                        write_load(mesh, self._scrapes, board.queues, self._trainer_wait,
                                   self.ledger.counts().get("dropped_stale", 0))
                    self._check_stall()
                    board.write()
                elif self.history.grown():  # a step ended: read it now, so its validation round starts now
                    self._read_history(bar)
                    if spec.weights.canary:  # the gate decides at steps: its timeline now, not at the next observation
                        board.weights = await self._weights_view(self._scrapes.get("trainer", {}))
                        board.write()
                if self.history.unlogged or self.tracking.busy:
                    await self.tracking.tick()
                await asyncio.sleep(self.poll_s)
        finally:
            if self.tracking is not None:
                tracking, self.tracking = self.tracking, None
                await tracking.finish(succeeded=False)
            if bar is not None:
                bar.close()
            await prompts.close()
            for q in watched.values():
                await q.close()

    def _on_exit(self, name: str) -> None:
        if name == "trainer":
            self.ledger.trainer = {}  # its successor reports counters restored from the checkpoint

    # ------------------------------------------------------------------ progress

    def _read_fed(self) -> None:
        """How many prompts the feeder has put, from its position file (the feeder may be
        restarting; the file is what it resumes from)."""
        fed = fed_count(self.run_dir / "feeder.json")
        self.board.prompts_fed = self.ledger.prompts_fed = fed

    def _check_stall(self) -> None:
        paused = self._canary_paused()
        if paused:  # waiting for an operator is not a stall
            self.sup.touch(time.monotonic())
            self.board.detail = paused
            return
        why = stall_reason(self.board.queues, in_flight=self.board.in_flight_prompts or 0,
                           max_in_flight=self.max_in_flight,
                           restarting=list(self.mesh.restarting), down=self.mesh.silent)
        stall = self.sup.stall(time.monotonic(), why)
        board = self.board
        if stall is None:
            if board.stalled:
                board.detail = ""
            return
        if not board.stalled or int(stall.seconds) % 60 == 0:
            self._log(f"meshrl run: stalled: {stall.reason}")
        board.detail = f"stalled: {stall.reason}"
        if stall.fatal:
            raise ServiceFailed(f"job stalled: {stall.reason}")

    async def _observe(self, bar) -> None:
        """Scrape every service (its heartbeat too) into the ledger and the step history."""
        live = self.mesh.live()
        urls = {p.name: p.url("metrics") + "/metrics" for p in live}
        got_all = await asyncio.gather(*(asyncio.to_thread(http_get, u, 2.0) for u in urls.values()))
        await self.mesh.answered({name: status == 200 for name, (status, _) in zip(urls, got_all)})
        self._scrapes = {}
        for name, (status, body) in zip(urls, got_all):
            got = parse_metrics(body) if status == 200 else {}
            if name == "trainer" and status == 200 and self.mesh.attachment is not None:
                self._trainer_wait = trainer_wait_s(body)
            self.ledger.observe(name, got, incarnation=self.sup.restarts().get(name, 0))
            self._scrapes[name] = got
        if "meshrl_feeder_in_flight_prompts" in self._scrapes.get("feeder", {}):  # as the queue's ledger says
            self.board.in_flight_prompts = int(self._scrapes["feeder"]["meshrl_feeder_in_flight_prompts"])
        trainer = self._scrapes.get("trainer", {})
        current = trainer.get("meshrl_trainer_policy_version")
        if self.spec.weights.canary and trainer.get("meshrl_weights_promoted_version", -1) >= 0:
            current = trainer["meshrl_weights_promoted_version"]  # what the replicas are to serve
        served = {n: s.get("meshrl_rollout_served_version") for n, s in self._scrapes.items() if n.startswith("rollout")}
        self.sup.versions(current, served, self.spec.async_.max_staleness, time.monotonic())
        self.board.weights = await self._weights_view(trainer)
        c = self.ledger.counts()
        self.sup.progress({k: c[k] for k in ("generated", "scored", "trained", "dropped_stale", "dropped_error")},
                          time.monotonic())
        self._read_history(bar)

    def _read_history(self, bar) -> None:
        """The trainer's new step lines into the history (and the progress bar)."""
        if self.history.read(self.ledger.tokens(), self.board.elapsed_s) and bar is not None:
            last = self.history.steps[-1]
            bar.update(last["step"] - bar.n)
            bar.set_postfix(reward=f"{last['reward_mean']:.3f}", staleness=f"{last['staleness']:.2f}",
                            tok_s=f"{last['tokens_per_s']:.0f}")

    async def _final_audit(self) -> None:
        """The per-sample check of the ledger (from the queue) once every service stopped."""
        from services.queues import make_queue

        state_file = self.run_dir / "feeder.json"
        if not state_file.exists():
            return
        # every service has stopped: the feeder's position is final (the last observation may
        # be an interval old, and a short job can end before the first one read it)
        self._read_fed()
        ckpt = Path(self.spec.trainer.default_local_dir)
        self.ledger.read_checkpoint(ckpt if ckpt.is_absolute() else self.run_dir / ckpt)
        q = make_queue(self._queue_cfg(), stream="experience", group="trainer", consumer="controller",
                       credential=self._queue_credential())
        try:
            self.ledger.audited = await asyncio.wait_for(
                audit(q, fed_uids_of(state_file), self.spec.rollout.n, self.ledger.counts()["trained"]), 60)
        except Exception as exc:  # noqa: BLE001 - the audit is a report, never a failure
            log.warning("ledger audit failed: %s", exc)
        finally:
            await q.close()
        self.ledger.save()

    async def _broker_ledger(self) -> None:
        """The embedded broker's per-stage ledger into ``meshrl_ledger_samples{stage}``."""
        if self._broker is not None and self._broker.broker is not None:
            try:
                self.board.control.set_ledger_counts(await asyncio.wait_for(self._broker.ledger_counts(), 5.0))
            except Exception as exc:  # noqa: BLE001 - a metric, never fatal
                log.warning("reading the broker's ledger failed: %s", exc)

    async def _depths(self, queues: dict) -> dict[str, int]:
        out = {}
        for name, q in queues.items():
            try:
                out[name] = int(await asyncio.wait_for(q.depth(), timeout=2.0))
            except Exception:  # noqa: BLE001 - a depth we cannot read is left out, never fatal
                pass
        return out

    async def _weights_view(self, trainer: dict[str, float]) -> dict[str, Any]:
        """``status.json`` ``weights``: per replica the version it serves and its role
        (canary / promoted / all), the promoted and candidate versions and, in canary mode,
        the gate's timeline (from the trainer's ``/status``). What cannot be read now (a
        replica or the trainer down, restarting or -- at the end -- gone) keeps its last
        known value, so the final status.json still shows where the job ended."""
        prev = self.board.weights or {}
        roles = {-1.0: "all", 0.0: "promoted", 1.0: "canary"}
        replicas = {n: {"served_version": s.get("meshrl_rollout_served_version"),
                        "role": roles.get(s.get("meshrl_rollout_canary", -1.0), "all")}
                    for n, s in self._scrapes.items() if n.startswith("rollout") and s}
        out: dict[str, Any] = {"mode": self.spec.weights.rollout.mode,
                               "replicas": {**prev.get("replicas", {}), **replicas}}
        if not trainer:  # the trainer's metrics are unreadable now: its figures as last seen
            return {**prev, **out}
        out["promoted"] = trainer.get("meshrl_weights_promoted_version")
        if not self.spec.weights.canary:
            return out
        candidate = trainer.get("meshrl_weights_candidate_version", -1.0)
        out.update(candidate=None if candidate < 0 else candidate, paused=self._canary_paused())
        gate: dict[str, Any] = {}
        if "trainer" in {p.name for p in self.mesh.live()}:
            status, body = await asyncio.to_thread(http_get, self.mesh.proc("trainer").url("metrics") + "/status", 2.0)
            try:
                gate = (json.loads(body) or {}).get("canary") or {} if status == 200 else {}
            except ValueError:
                gate = {}
        for k in ("rejected", "events", "held_samples"):
            if k in gate or k in prev:
                out[k] = gate[k] if k in gate else prev[k]
        return out

    def _canary_paused(self) -> str:
        """Canary mode: why the trainer is paused after a rejection ("" when it is not)."""
        if not self.spec.weights.canary or not self._scrapes.get("trainer", {}).get("meshrl_weights_rollout_paused"):
            return ""
        return ("paused: a version was rejected at the canary (weights.rollout.on_reject=pause); "
                f"resume with `meshrl canary {self.run_dir} --resume`")

    # ------------------------------------------------------------------ helpers

    def _progress_bar(self):
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=self.spec.trainer.total_steps, desc=f"{self.spec.name}", unit="step", dynamic_ncols=True)

    def _log(self, msg: str) -> None:
        print(msg, flush=True)
