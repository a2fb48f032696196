"""``services.launcher: ray``, the controller's side: every service instance of a
``meshrl run`` job in its own Ray actor.

The controller (``meshrl run``'s :class:`~controller_svc.controller.JobController`) stays
the Ray driver: it hosts the embedded broker and the prompt feeder, and supervises the
services with the same restart policy as the local launcher (services/supervision.py).
Only *where a service process runs* changes:

* :class:`RayPlacement` connects to the cluster (``services.ray.address``) and reserves
  one placement group for the whole job -- one bundle per service instance (the trainer
  with all its ranks, each rollout replica, each reward worker), each bundle the
  instance's request: ``num_cpus``, ``num_gpus`` for a ``cuda`` device, and custom
  resources (``services.<svc>.ray``). The job starts whole or not at all: if the group
  is not placed within ``services.ray.placement_timeout_s`` the job fails, naming what
  was asked and what the cluster has.
* :class:`RayServiceProcess` is the controller's handle of one instance, with the
  interface of :class:`~services.procs.ServiceProcess` (``start``, ``wait_ready``,
  ``returncode``, ``signal``, ``stop``, ``tail``), so supervision does not know the
  difference. ``start`` creates a :class:`~services.ray_launcher.actor.ServiceActor` in the
  instance's bundle; the actor reports its node's IP, the controller renders the service's
  view for that node (its servers bind the node's IP; replicas reach the trainer's weight
  channel at the trainer's node), and the actor runs ``python -m <service> --config <view>``
  there.
  Addresses are discovered at run time from the service's ``MESHRL_READY`` line.
* An actor that dies -- its process, or its whole node -- is an exit like any other
  (code ``-9``, reason "its Ray actor died"); a restart creates a new actor in the same
  bundle, which Ray places again (on another node when the bundle's node is gone and
  another has the resources).

A set of instances that grows and shrinks (a fleet's replicas, ``fleet_svc``) uses
:class:`InstanceGroups` instead of one group: a placement group per instance, created when it
starts and removed when it stops for good, so only running instances hold resources.

A service process must not outlive its actor (a node's raylet dying kills the actor's
worker, not the processes it started): each service runs in a process group of its own,
watched by a small guard process (``python -m services.ray_launcher.guard``) that
kills the group when the actor's worker is gone.

Only plain strings, numbers, lists and dicts cross Ray calls; every wait has a deadline.

This module is the controller's side; what runs in each actor is :mod:`services.ray_launcher.actor`,
and the guard :mod:`services.ray_launcher.guard`.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from services.ray_launcher.actor import ServiceActor
from services.procs import ServiceFailed, log_tail
from services.readiness import Ready

CALL_TIMEOUT_S = 30.0  # a short actor call (signal, poll, tail); a node that does not answer is treated as gone
SIGNAL_TIMEOUT_S = 5.0  # a signal the actor does not take this fast: its node is going; the exit says so soon



def service_kind(name: str) -> str:
    """``rollout-1`` -> ``rollout``."""
    return name.split("-")[0]


# ---------------------------------------------------------------------------------------------------------------
# What each instance asks for


def instance_names(spec: Any) -> list[str]:
    """The job's service instances, in the order the controller starts them."""
    return ["trainer", *(f"reward-{i}" for i in range(spec.services.reward.replicas)),
            *(f"rollout-{i}" for i in range(spec.services.rollout.replicas))]


def request_of(spec: Any, name: str) -> dict[str, float]:
    """The Ray resources of service instance ``name`` of job ``spec``: a placement-group
    bundle (``CPU``, ``GPU`` and custom resources)."""
    from services.placement import parse_cpu_list

    kind = service_kind(name)
    res = getattr(spec.services, kind)
    nproc = res.nproc if kind == "trainer" else 1
    cpus = res.ray.num_cpus
    if cpus is None:
        cpus = float(len(parse_cpu_list(res.cpus))) if res.cpus else float(nproc)
    bundle: dict[str, float] = {"CPU": float(cpus)}
    if res.device == "cuda":
        bundle["GPU"] = float(nproc)
    bundle.update({k: float(v) for k, v in res.ray.resources.items()})
    return {k: v for k, v in bundle.items() if v > 0}


def labels_of(spec: Any, name: str) -> dict[str, str]:
    """The node label selector of service instance ``name`` (``services.<svc>.ray.labels``)."""
    return dict(getattr(spec.services, service_kind(name)).ray.labels)


def _fmt_labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(labels.items())) + "}"


def _fmt(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


# ---------------------------------------------------------------------------------------------------------------
# The controller's side


class RayPlacement:
    """The job's connection to the Ray cluster and its one placement group."""

    def __init__(self, spec: Any, names: list[str]) -> None:
        self.spec = spec
        self.cfg = spec.services.ray
        self.names = list(names)
        self.bundles = [request_of(spec, n) for n in self.names]
        self.selectors = [labels_of(spec, n) for n in self.names]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.pg: Any = None
        self.ray: Any = None
        self.tag = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        self._actor_cls: Any = None

    @property
    def address(self) -> str:
        return self.cfg.address or os.environ.get("RAY_ADDRESS") or "auto"

    def connect(self) -> "RayPlacement":
        try:
            import ray
        except ImportError:
            raise ServiceFailed("services.launcher=ray needs Ray: pip install 'meshrl[ray]'") from None
        if not ray.is_initialized():
            import logging

            # (from the controller's worker thread Ray warns that it leaves SIGTERM alone: as it should)
            logging.getLogger("ray._private.worker").setLevel(logging.ERROR)
            try:
                ray.init(address=self.address, namespace=self.cfg.namespace, log_to_driver=False,
                         configure_logging=False)  # fmt: skip
            except Exception as exc:  # ConnectionError and Ray's own errors
                raise ServiceFailed(f"services.ray.address: cannot connect to the Ray cluster at {self.address!r}: "
                                    f"{type(exc).__name__}: {exc}") from None
        self.ray = ray
        self._actor_cls = ray.remote(max_restarts=0, max_concurrency=8)(ServiceActor)
        return self

    def check_host(self) -> None:
        """The services reach the embedded broker at ``services.host``: a loopback address
        cannot work from another machine of the cluster."""
        host = self.spec.services.host
        if self.spec.queues.type != "embedded" or not (host.startswith("127.") or host == "localhost"):
            return
        here = {self.ray.util.get_node_ip_address(), "127.0.0.1"}
        try:
            here.update(socket.gethostbyname_ex(socket.gethostname())[2])
        except OSError:
            pass
        away = sorted({n["NodeManagerAddress"] for n in self.ray.nodes() if n.get("Alive")} - here)
        if away:
            raise ServiceFailed(
                f"services.host={host} is a loopback address, but the Ray cluster has nodes on other machines "
                f"({', '.join(away)}): their services could not reach this job's embedded broker; set services.host "
                "to an address of this machine those nodes reach")

    def reserve(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Create the placement group and wait until every bundle is placed (all or nothing),
        at most ``services.ray.placement_timeout_s``."""
        from ray.util.placement_group import placement_group

        ray = self.ray
        self.check_host()
        labels = {"bundle_label_selector": self.selectors} if any(self.selectors) else {}
        try:
            self.pg = placement_group(self.bundles, strategy=self.cfg.strategy, name=f"meshrl-{self.tag}", **labels)
        except TypeError:  # a Ray without label selectors for placement group bundles
            raise ServiceFailed(f"services.<trainer|rollout|reward>.ray.labels: this Ray ({ray.__version__}) cannot "
                                "place by node labels; use ray.resources, or Ray >= 2.49") from None
        except ValueError as exc:  # Ray's own check of the selectors
            raise ServiceFailed(f"services.<trainer|rollout|reward>.ray.labels: Ray refuses them: {exc}") from None
        ref = self.pg.ready()
        deadline = time.monotonic() + self.cfg.placement_timeout_s
        while True:
            done, _ = ray.wait([ref], timeout=1.0)
            if done:
                ray.get(ref, timeout=CALL_TIMEOUT_S)
                return
            if should_stop():
                raise ServiceFailed("stopped while waiting for the job's placement group")
            if time.monotonic() > deadline:
                asked = "; ".join(f"{n} {_fmt(b)}" + (f" on labels {_fmt_labels(sel)}" if sel else "")
                                  for n, b, sel in zip(self.names, self.bundles, self.selectors))
                have = "; ".join(
                    f"{n['NodeManagerAddress']} {_fmt({k: v for k, v in n['Resources'].items() if '_group_' not in k and not k.startswith('node:')})}"  # noqa: E501
                    + (f" labels {_fmt_labels(own)}" if (own := _own_labels(n)) and any(self.selectors) else "")
                    for n in ray.nodes() if n.get("Alive"))  # fmt: skip
                raise ServiceFailed(
                    f"the Ray cluster could not place this job within services.ray.placement_timeout_s="
                    f"{self.cfg.placement_timeout_s:g} (strategy {self.cfg.strategy}): it asks {asked}; the live nodes "
                    f"have {have or 'nothing'} (see services.<trainer|rollout|reward>.ray and `ray status`)")

    def new_actor(self, name: str) -> Any:
        """A fresh actor for ``name`` in its bundle (pending until Ray can place it there)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = self.bundles[self.index[name]]
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        pg, index = self._group_of(name)
        return self._actor_cls.options(
            name=f"meshrl-{self.tag}-{name}-{uuid.uuid4().hex[:6]}", namespace=self.cfg.namespace,
            num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), resources=custom or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index),
        ).remote(name)  # fmt: skip

    def _group_of(self, name: str) -> tuple[Any, int]:
        """The placement group and bundle index of instance ``name``."""
        return self.pg, self.index[name]

    def release(self) -> None:
        if self.ray is None:
            return
        try:
            if self.pg is not None:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001 - the cluster may be gone already
            pass
        finally:
            self.pg = None
            self.ray.shutdown()


class InstanceGroups(RayPlacement):
    """A placement group per instance, created when the instance starts and removed when it
    stops for good (:meth:`release_instance`): for a set of instances that grows and shrinks
    (a fleet's replicas, ``fleet_svc``), which holds the cluster's resources only for the
    instances it runs. Nothing is reserved up front: an instance's actor waits for its group,
    and :meth:`RayServiceProcess.wait_ready` fails it after ``placement_timeout_s``, naming
    its bundle. A restarted instance gets a new actor in the group it has.

    ``cfg``: ``placement_timeout_s``, ``namespace``, ``address`` (a job spec's
    ``services.ray``); ``bundles``: each instance's request (``CPU``, ``GPU``, custom);
    ``selectors``: node label selectors, by instance."""

    def __init__(self, cfg: Any, tag: str, bundles: dict[str, dict[str, float]],
                 selectors: dict[str, dict[str, str]] | None = None) -> None:
        import threading

        self.spec = None
        self.cfg = cfg
        self.names = list(bundles)
        self.bundles = [dict(bundles[n]) for n in self.names]
        self.selectors = [dict((selectors or {}).get(n) or {}) for n in self.names]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.pg = None
        self.groups: dict[str, Any] = {}
        self.ray = None
        self.tag = f"{tag}-{uuid.uuid4().hex[:8]}"
        self._actor_cls = None
        self._lock = threading.Lock()

    def reserve(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Nothing to reserve up front (each instance's group comes with its start)."""

    def _group_of(self, name: str) -> tuple[Any, int]:
        from ray.util.placement_group import placement_group

        with self._lock:
            pg = self.groups.get(name)
            if pg is None:
                i = self.index[name]
                sel = self.selectors[i]
                labels = {"bundle_label_selector": [sel]} if sel else {}
                try:
                    pg = placement_group([self.bundles[i]], strategy="PACK", name=f"meshrl-{self.tag}-{name}", **labels)
                except TypeError:  # a Ray without label selectors for placement group bundles
                    raise ServiceFailed(f"{name}: ray labels: this Ray ({self.ray.__version__}) cannot place by "
                                        "node labels; use resources, or Ray >= 2.49") from None
                except ValueError as exc:  # Ray's own check of the selectors
                    raise ServiceFailed(f"{name}: ray labels: Ray refuses them: {exc}") from None
                self.groups[name] = pg
        return pg, 0

    def release_instance(self, name: str) -> None:
        """Remove instance ``name``'s group (its actor ended first): its resources go back to the cluster."""
        with self._lock:
            pg = self.groups.pop(name, None)
        if pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group

                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass

    def release(self) -> None:
        if self.ray is None:
            return
        for name in list(self.groups):
            self.release_instance(name)
        self.ray.shutdown()


class RayServiceProcess:
    """One service instance run by a :class:`ServiceActor`; the controller's handle, with
    the interface of :class:`~services.procs.ServiceProcess`.

    ``render(node)`` returns the view YAML for the node the actor landed on (``node``: what
    :meth:`ServiceActor.node` reported: ``ip``, ``node_id``, free ``ports`` there)."""

    def __init__(self, name: str, module: str, placement: RayPlacement, render: Callable[[dict[str, Any]], str],
                 view_path: Path, log_path: Path, env: dict[str, str], args: Sequence[str] = ()) -> None:
        self.name = name
        self.module = module  # what the actor runs: ``python -m MODULE --config VIEW --id NAME``
        self.args = list(args)  # after ``--config VIEW --id NAME`` (a fleet replica's --fleet-dir, --adapter-slots)
        self.placement = placement
        self.render = render
        self.view_path = view_path
        self.log_path = log_path
        self.env = dict(env)
        self.kill_reason = ""
        self.ready: Ready | None = None
        self.node: dict[str, Any] | None = None
        self.actor: Any = None
        self._pid: int | None = None
        self._exit_ref: Any = None
        self._exit: int | None = None

    @property
    def ray(self) -> Any:
        return self.placement.ray

    # -------------------------------------------------------------- lifecycle

    def start(self) -> "RayServiceProcess":
        """Create the actor (returns at once; :meth:`wait_ready` does the rest)."""
        self._drop_actor()
        self.ready, self.node, self._pid, self._exit_ref, self._exit = None, None, None, None, None
        self.actor = self.placement.new_actor(self.name)
        return self

    def wait_ready(self, timeout: float, should_stop: Callable[[], bool] = lambda: False) -> Ready | None:
        """Wait for the actor to be placed, start the service on its node and wait for its
        readiness line; None if ``should_stop()`` first. ServiceFailed (and the instance
        counts as exited) if the actor dies, cannot be placed in time, or the service
        exits or stays silent past ``timeout``."""
        placing = self.placement.cfg.placement_timeout_s
        try:
            node = self._call(self.actor.node.remote(3), time.monotonic() + placing, should_stop,
                              f"placed on a Ray node within services.ray.placement_timeout_s={placing:g}")
            if node is None:
                return None
            self.node = node
            deadline = time.monotonic() + timeout
            view = self.render(node)
            more = (self.args,) if self.args else ()
            started = self._call(self.actor.start.remote(self.module, view, str(self.view_path), str(self.log_path),
                                                         self.env, *more), deadline, should_stop, "started")
            if started is None:
                return None
            self._pid = int(started["pid"])
            self._exit_ref = self.actor.wait_exit.remote()
            left = max(1.0, deadline - time.monotonic())
            got = self._call(self.actor.wait_ready.remote(left), deadline + CALL_TIMEOUT_S, should_stop,
                             f"ready within {timeout:.0f}s")
            if got is None:
                return None
        except ServiceFailed:
            self._gone()
            raise
        if not got["ok"]:
            if self.returncode is None:  # alive but never ready: counts as a crash
                self.kill_reason = "not ready in time"
            self._gone()
            raise ServiceFailed(f"{self.name} on {self._where()} {got['error']}")
        self.ready = Ready(got["service"], got["id"], int(got["pid"]), dict(got["addresses"]), dict(got["info"]))
        return self.ready

    def _gone(self) -> None:
        """This incarnation failed: it counts as exited (-1 unless its exit code is known),
        and its actor ends (its guard then kills whatever of the service still runs)."""
        if self._exit_ref is not None:
            self.wait_exit(3.0)  # an exit just now: its own code
        if self.returncode is None:
            self._exit = -1
        self._drop_actor()

    def _call(self, ref: Any, deadline: float, should_stop: Callable[[], bool], what: str) -> Any:
        """``ray.get(ref)`` by the deadline, polling ``should_stop`` (None if it fires)."""
        ray = self.ray
        while True:
            done, _ = ray.wait([ref], timeout=0.5)
            if done:
                try:
                    return ray.get(ref, timeout=CALL_TIMEOUT_S)
                except Exception as exc:  # noqa: BLE001 - RayActorError, ActorDiedError, task errors
                    self.kill_reason = f"its Ray actor died: {type(exc).__name__}"
                    raise ServiceFailed(f"{self.name} was not {what}: its Ray actor failed on {self._where()}: "
                                        f"{_first_line(exc)}") from None
            if should_stop():
                return None
            if time.monotonic() > deadline:
                self.kill_reason = f"not {what}"
                self._drop_actor()
                raise ServiceFailed(f"{self.name} was not {what} (Ray placement group bundle "
                                    f"{_fmt(self.placement.bundles[self.placement.index[self.name]])}; "
                                    f"services.ray.placement_timeout_s and `ray status` tell what is missing)")

    @property
    def returncode(self) -> int | None:
        """The exit code once the service (or its actor, or its node) is gone; ``-9`` for a dead actor."""
        if self._exit is not None or self._exit_ref is None:
            return self._exit
        done, _ = self.ray.wait([self._exit_ref], timeout=0)
        if not done:
            return None
        try:
            self._exit = int(self.ray.get(self._exit_ref, timeout=CALL_TIMEOUT_S))
        except Exception as exc:  # noqa: BLE001 - the actor or its node died
            self._exit = -9
            self.kill_reason = self.kill_reason or f"its Ray actor died on {self._where()}: {type(exc).__name__}"
        return self._exit

    @property
    def pid(self) -> int | None:
        """The service's pid on its node."""
        return self._pid

    def wait_exit(self, timeout: float = 60.0) -> int | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.returncode is not None:
                return self._exit
            if self._exit_ref is None:
                return None
            self.ray.wait([self._exit_ref], timeout=min(1.0, max(0.0, end - time.monotonic())))
        return self.returncode

    def signal(self, sig: int) -> None:
        if self.actor is None or self.returncode is not None:
            return
        try:
            self.ray.get(self.actor.signal.remote(int(sig)), timeout=SIGNAL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - an actor that does not answer is handled as gone by returncode
            pass

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM (SIGKILL after ``grace``) on its node, then end the actor."""
        self._drop_actor(grace)
        return self.wait_exit(5.0) if self._exit_ref is not None else self._exit

    def _drop_actor(self, grace: float = 0.0) -> None:
        """Stop the service on its node -- and whatever of its process group is left, even
        once the service itself exited (a replica's vLLM engine outlives it otherwise) --
        then end the actor. An actor that does not answer (its node gone) is just ended."""
        if self.actor is not None and self._exit_ref is not None:
            try:
                self.ray.get(self.actor.stop.remote(float(grace)), timeout=grace + CALL_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the actor may be dead already; killing it below is what matters
                pass
        if self.actor is not None:
            try:
                self.ray.kill(self.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self.actor = None

    # -------------------------------------------------------------- what the controller reads

    def url(self, endpoint: str = "metrics") -> str:
        if self.ready is None:
            raise RuntimeError(f"{self.name} has not announced readiness")
        return f"http://{self.ready.address(endpoint)}"

    def tail(self, lines: int = 25) -> str:
        """The last lines of its log: from the actor, else from the file (shared storage)."""
        if self.actor is not None:
            try:
                return self.ray.get(self.actor.tail.remote(lines), timeout=10)
            except Exception:  # noqa: BLE001 - the node is gone: the file may still be readable here
                pass
        return log_tail(self.log_path, lines)

    def failure(self) -> str:
        return f"{self.name} exited with code {self.returncode}; last lines of {self.log_path}:\n{self.tail()}"

    def where(self) -> dict[str, Any] | None:
        return self.node

    def _where(self) -> str:
        return f"node {self.node['ip']} ({self.node['node_id'][:12]})" if self.node else "an unplaced Ray actor"


def _own_labels(node: dict[str, Any]) -> dict[str, str]:
    """A node's labels as ``ray.nodes()`` lists them, without the ones Ray sets (``ray.io/...``)."""
    return {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
