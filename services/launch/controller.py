"""The job controller behind ``meshrl run``: one job on this machine.

It hosts the embedded queue broker (when ``queues.type == "embedded"``), writes one
resolved config per service (STYLE.md #8), starts the trainer, the reward workers and
the rollout replicas as child processes, feeds prompts with admission control, and
watches: the first service to crash stops the job (saying which and why), Ctrl-C stops
it cleanly, and the trainer finishing ``trainer.total_steps`` ends it. Progress goes to
a bar on stderr, to ``<run_dir>/status.json`` (read by the gateway's local launcher) and
to the controller's own ``/metrics`` (feeder, queue depths, the embedded broker's ledger:
:mod:`services.launch.control_metrics`; its URL is ``metrics_url`` in ``status.json``); at
the end ``<run_dir>/summary.json`` and PNG plots.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import yaml

from services import auth
from services.config.job import dump_job
from services.launch.procs import ServiceFailed, ServiceProcess, become_subreaper, kill_adopted, python_module_argv
from services.launch.report import History, scrape, write_report
from services.net import free_port

log = logging.getLogger("meshrl.run")


class JobController:
    """Runs ``spec`` (a validated JobSpec) with its files under ``run_dir``."""

    def __init__(self, spec: Any, run_dir: str | Path, *, progress: bool = True, poll_s: float = 0.5) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir).resolve()
        self.progress = progress
        self.poll_s = poll_s
        self.procs: list[ServiceProcess] = []
        self.history = History(self.run_dir / "trainer_metrics.jsonl")
        self._stop_signal: int | None = None
        self._t0 = time.monotonic()
        self.state = "pending"
        self.detail = ""
        self.metrics_url: str | None = None
        self._broker = None
        self._feeder = None
        self._queues: dict[str, int] = {}
        self.credential: auth.JobCredential | None = None
        self.credential_file = self.run_dir / auth.FILE_NAME

    def _make_credential(self) -> auth.JobCredential:
        """This job's own secret: a new one per run, in ``<run_dir>/job.credential`` (0600),
        handed to every service through ``MESHRL_JOB_CREDENTIAL_FILE``."""
        cred = auth.JobCredential.generate()
        cred.write(self.credential_file)
        return cred

    # ------------------------------------------------------------------ config files

    def _resolved_configs(self) -> dict[str, Path]:
        """Pick concrete ports and write ``configs/<service>.yaml`` for every child."""
        spec, host = self.spec, self.spec.services.host
        base = json.loads(json.dumps(spec.model_dump(mode="json", by_alias=True)))
        if base["queues"]["type"] == "embedded":
            base["queues"]["address"] = f"{host}:{self.broker_port}"
        base["weights"]["host"] = host
        # A local job owns its ports: fixed defaults (meant for one service per container)
        # would let two jobs on one machine collide.
        base["weights"]["control_port"] = free_port(host)
        base["weights"]["rendezvous_port"] = free_port(host)
        if not base["weights"].get("snapshot_dir"):
            base["weights"]["snapshot_dir"] = str(self.run_dir / "snapshots")
        base["trainer"]["default_local_dir"] = str(self.run_dir / base["trainer"]["default_local_dir"])
        cfg_dir = self.run_dir / "configs"
        cfg_dir.mkdir(parents=True, exist_ok=True)
        out: dict[str, Path] = {}

        def write(name: str, raw: dict) -> None:
            path = cfg_dir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(raw, sort_keys=False))
            out[name] = path

        t = json.loads(json.dumps(base))
        t["trainer"]["metrics_host"], t["trainer"]["metrics_port"] = host, free_port(host)
        t["trainer"]["metrics_file"] = str(self.history.metrics_file)
        write("trainer", t)
        for i in range(spec.services.reward.replicas):
            r = json.loads(json.dumps(base))
            r["reward"]["host"], r["reward"]["metrics_port"] = host, free_port(host)
            write(f"reward-{i}", r)
        for i in range(spec.services.rollout.replicas):
            r = json.loads(json.dumps(base))
            r["rollout"]["host"], r["rollout"]["metrics_port"] = host, free_port(host)
            write(f"rollout-{i}", r)
        (self.run_dir / "job.yaml").write_text(dump_job(self.spec))
        return out

    def _service(self, name: str, cfg: Path) -> ServiceProcess:
        raw = yaml.safe_load(cfg.read_text())
        host = self.spec.services.host
        env = {"OMP_NUM_THREADS": "1", "MESHRL_RUN_DIR": str(self.run_dir), auth.ENV: str(self.credential_file)}
        if name == "trainer":
            argv = python_module_argv("trainer_svc", "--config", str(cfg))
            port = raw["trainer"]["metrics_port"]
        elif name.startswith("reward"):
            argv = python_module_argv("reward_svc", "--config", str(cfg), "--consumer", name)
            port = raw["reward"]["metrics_port"]
        else:
            argv = python_module_argv("rollout_svc", "--config", str(cfg), "--name", name)
            port = raw["rollout"]["metrics_port"]
            env["VLLM_CPU_KVCACHE_SPACE"] = str(int(max(1, raw["rollout"].get("kv_cache_space_gib") or 1)))
        return ServiceProcess(name, argv, self.run_dir / "logs" / f"{name}.log",
                              ready_url=f"http://{host}:{port}/ready", env=env)

    # ------------------------------------------------------------------ main

    def run(self) -> int:
        """Run the job to the end; returns the exit code (0 done, 1 a service failed, 130 interrupted)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        become_subreaper()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        try:
            return asyncio.run(self._main())
        finally:
            self._stop_all()
            self._write_status()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    async def _main(self) -> int:
        spec = self.spec
        broker = None
        self.credential = self._make_credential()
        self.broker_port = free_port(spec.services.host)
        from services.launch.control_metrics import ControlMetrics
        from services.metrics.server import MetricsServer

        self.control = ControlMetrics()
        http = MetricsServer(self.control.registry, host=spec.services.host, port=free_port(spec.services.host)).start()
        self.metrics_url = f"http://{spec.services.host}:{http.port}/metrics"
        if spec.queues.type == "embedded":
            from services.queues.broker_server import EmbeddedBroker

            broker = self._broker = await EmbeddedBroker(host=spec.services.host, port=self.broker_port,
                                                         aof_path=self.run_dir / "broker.aof",
                                                         credential=self.credential).start()
        try:
            configs = self._resolved_configs()
            self.state = "starting"
            self._write_status()
            trainer = self._service("trainer", configs["trainer"])
            self.procs.append(trainer.start())
            others = [self._service(n, p) for n, p in configs.items() if n != "trainer"]
            for p in others:
                self.procs.append(p.start())
            for p in self.procs:
                timeout = spec.rollout.engine_startup_timeout_s if p.name.startswith("rollout") else 600.0
                await asyncio.to_thread(p.wait_ready, timeout)
                self._log(f"{p.name} ready")
                if self._stop_signal is not None:
                    return 130
            self.state = "running"
            return await self._loop(trainer)
        except ServiceFailed as exc:
            self.state, self.detail = "failed", str(exc)
            self._log(f"meshrl run: {exc}")
            return 1
        finally:
            self._stop_all()
            if broker is not None:
                self.control.set_ledger(broker.state.ledger.values())
                await broker.stop()
            http.stop()

    async def _loop(self, trainer: ServiceProcess) -> int:
        from services.queues import make_queue

        spec = self.spec
        queues_cfg = spec.queues
        if queues_cfg.type == "embedded":
            queues_cfg = queues_cfg.model_copy(update={"address": f"{spec.services.host}:{self.broker_port}"})
        qm = self.control.queues
        cred = self.credential if queues_cfg.type == "embedded" else None
        prompts = make_queue(queues_cfg, stream="prompts", group="controller", consumer="feeder", metrics=qm,
                             credential=cred)
        watched = {name: make_queue(queues_cfg, stream=name, group=group, consumer="controller", metrics=qm,
                                    credential=cred)
                   for name, group in (("prompts", "rollout"), ("rollouts", "reward"), ("experience", "trainer"))}
        feeder = self._feeder = self._make_feeder(prompts)
        trainer_url = yaml.safe_load((self.run_dir / "configs" / "trainer.yaml").read_text())["trainer"]
        trainer_url = f"http://{spec.services.host}:{trainer_url['metrics_port']}"
        rollout_urls = [p.ready_url.rsplit("/", 1)[0] for p in self.procs if p.name.startswith("rollout")]
        bar = self._progress_bar()
        n = spec.rollout.n
        try:
            while True:
                if self._stop_signal is not None:
                    self.state, self.detail = "cancelled", f"stopped by signal {self._stop_signal}"
                    self._log("meshrl run: interrupted; stopping the services (the trainer checkpoints first)")
                    return 130
                tokens, served = 0.0, []
                for u in rollout_urls:
                    r = await asyncio.to_thread(scrape, u + "/metrics")
                    tokens += r.get("meshrl_rollout_tokens_total", 0.0)
                    served.append(r.get("meshrl_rollout_served_version"))
                if self.history.read(tokens, time.monotonic() - self._t0) and bar is not None:
                    last = self.history.steps[-1]
                    bar.update(last["step"] - bar.n)
                    bar.set_postfix(reward=f"{last['reward_mean']:.3f}", staleness=f"{last['staleness']:.2f}",
                                    tok_s=f"{last['tokens_per_s']:.0f}")
                if trainer.returncode == 0:
                    self.history.read(tokens, time.monotonic() - self._t0)  # lines written just before exit
                    if bar is not None and self.history.steps:
                        bar.update(self.history.steps[-1]["step"] - bar.n)
                    self.state, self.detail = "succeeded", f"trained {spec.trainer.total_steps} steps"
                    return 0
                for p in self.procs:
                    if p.returncode is not None:
                        raise ServiceFailed(p.failure())
                t = await asyncio.to_thread(scrape, trainer_url + "/metrics")
                finished = (t.get("meshrl_trainer_samples_total", 0.0) + t.get("meshrl_trainer_dropped_stale_samples_total", 0.0)
                            + t.get("meshrl_trainer_dropped_error_samples_total", 0.0)) / n
                current = t.get("meshrl_trainer_policy_version")
                put = await feeder.top_up(int(finished), timeout=spec.queues.put_timeout_s,
                                          replicas_current=current is not None and all(v == current for v in served))
                self.control.fed(put, feeder.state.fed, int(finished), feeder.max_in_flight)
                if self._broker is not None:
                    self.control.set_ledger(self._broker.state.ledger.values())
                self._write_status(feeder=feeder, queues=await self._depths(watched))
                # sync mode waits on the controller to see each step end: poll faster there
                await asyncio.sleep(self.poll_s if spec.async_.mode == "async" else min(self.poll_s, 0.1))
        finally:
            if bar is not None:
                bar.close()
            await prompts.close()
            for q in watched.values():
                await q.close()

    async def _depths(self, queues: dict) -> dict[str, int]:
        out = {}
        for name, q in queues.items():
            try:
                out[name] = int(await asyncio.wait_for(q.depth(), timeout=2.0))
            except Exception:  # noqa: BLE001 - a depth we cannot read is left out, never fatal
                pass
        return out

    def _make_feeder(self, queue):
        from services.launch.feeder import build_feeder

        return build_feeder(self.spec, queue, log=self._log)

    # ------------------------------------------------------------------ helpers

    def _progress_bar(self):
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=self.spec.trainer.total_steps, desc=f"{self.spec.name}", unit="step", dynamic_ncols=True)

    def _log(self, msg: str) -> None:
        print(msg, flush=True)

    def _stop_all(self) -> None:
        """Trainer first (it checkpoints on SIGTERM), then the replicas and reward workers."""
        for p in sorted(self.procs, key=lambda p: p.name != "trainer"):
            p.stop(grace=30.0 if p.name == "trainer" else 15.0)
        leftovers = kill_adopted()
        if leftovers:
            log.warning("killed %d leftover descendant process(es) of the job's services", len(leftovers))

    def _write_status(self, feeder=None, queues: dict | None = None) -> None:
        # the final write (after the loop) keeps the last figures the loop saw
        feeder = feeder or self._feeder
        if queues is not None:
            self._queues = queues
        queues = self._queues
        last = self.history.steps[-1] if self.history.steps else {}
        status = {
            "state": self.state, "detail": self.detail, "step": last.get("step", 0),
            "total_steps": self.spec.trainer.total_steps, "reward_mean": last.get("reward_mean"),
            "staleness": last.get("staleness"), "tokens_per_s": last.get("tokens_per_s"),
            "prompts_fed": feeder.state.fed if feeder else None, "elapsed_s": round(time.monotonic() - self._t0, 1),
            "pid": os.getpid(), "queues": queues or {}, "metrics_url": self.metrics_url,
            **{k: last.get(k) for k in ("loss", "kl", "entropy", "grad_norm", "logprob_diff", "val_score")},
        }
        tmp = self.run_dir / "status.json.tmp"
        tmp.write_text(json.dumps(status))
        os.replace(tmp, self.run_dir / "status.json")
        if self.state in ("succeeded", "failed", "cancelled") and self.history.steps:
            write_report(self.history, self.run_dir)
