"""The data plane: a torch.distributed process group built straight from a TCPStore.

The group is NOT the global default group: each membership epoch gets its own
``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) over a ``PrefixStore`` of the
publisher's TCPStore, so the trainer's own FSDP group is untouched and a broken epoch is
simply dropped. Gloo and NCCL go through the same code: ``DataGroup.broadcast`` posts the
collective asynchronously and waits on its future with a deadline and an abort event, so
no caller ever blocks longer than ``timeout_s``.
"""

from __future__ import annotations

import datetime
import logging
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from services.weights.errors import TransferError

log = logging.getLogger("meshrl.weights")


def resolve_backend(backend: str) -> str:
    """'gloo' or 'nccl' for a configured backend ('auto' picks nccl when CUDA is usable)."""
    if backend == "auto":
        nccl = getattr(dist, "ProcessGroupNCCL", None) is not None and torch.cuda.is_available()
        return "nccl" if nccl else "gloo"
    if backend == "nccl" and getattr(dist, "ProcessGroupNCCL", None) is None:
        raise TransferError("backend 'nccl' requested but this torch build has no NCCL")
    if backend not in ("gloo", "nccl"):
        raise TransferError(f"unknown backend {backend!r}")
    return backend


def device_for(backend: str) -> torch.device:
    """The device buffers of ``backend`` live on (the current CUDA device for nccl)."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class GroupSpec:
    """Everything needed to join one epoch's group (what a JOIN message carries)."""

    store_host: str
    store_port: int
    store_prefix: str
    rank: int
    world_size: int
    backend: str
    timeout_s: float
    gloo_devices: int = 1
    """gloo: connection sets per rank (the same on every rank; see ``DataGroup``)."""


def connect_store(host: str, port: int, timeout_s: float, is_master: bool = False) -> dist.TCPStore:
    """A TCPStore client (or the server when ``is_master``, listening on ``host`` only) with a
    deadline on every wait."""
    from services.net import tcp_store

    try:
        return tcp_store(host, port, timeout_s, is_master=is_master)
    except Exception as e:  # DistStoreError / RuntimeError: unreachable or timed out
        raise TransferError(f"cannot reach rendezvous store {host}:{port}: {e}") from e


def _gloo_device(interface: str | None, address: str | None):  # noqa: ANN202 - a gloo Device
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface)
    if address and address != "0.0.0.0":
        from services.net import is_local_address

        if is_local_address(address):
            return dist.ProcessGroupGloo.create_device(hostname=address)
        log.warning("gloo: %s is not an address of this machine; using gloo's default device", address)
    return dist.ProcessGroupGloo.create_default_device()


class DataGroup:
    """One epoch's process group; rank 0 is the publisher.

    ``abort()`` (from any thread) makes pending and future ``broadcast`` calls fail at once;
    the underlying collective then finishes or times out on its own inside torch.
    """

    def __init__(self, spec: GroupSpec, store: dist.Store, gloo_interface: str | None = None, gloo_threads: int = 2,
                 gloo_address: str | None = None):
        """``gloo_interface`` (a NIC name) or else ``gloo_address`` (an IP of this machine) is
        where gloo's data ports listen; neither: gloo's default (the hostname's address)."""
        self.spec = spec
        self.device = device_for(spec.backend)
        self._aborted = threading.Event()
        self._abort_reason = ""
        self.release_thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Weak: completion callbacks run on the backend's own threads and must never hold
        # (and so possibly destroy) the group there -- its destructor joins those threads.
        self._waiters: weakref.WeakSet[threading.Event] = weakref.WeakSet()
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        prefixed = dist.PrefixStore(spec.store_prefix, store)
        try:
            if spec.backend == "gloo":
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = timeout
                # Each device is a full set of connections with its own I/O thread, and
                # gloo hands consecutive collectives to the devices in turn: with two, the
                # publisher's pipelined broadcasts move in parallel instead of sharing one
                # thread's sockets (the CPU data plane's bottleneck on one host).
                opts._devices = [_gloo_device(gloo_interface, gloo_address) for _ in range(max(1, spec.gloo_devices))]
                opts._threads = gloo_threads
                self._pg = dist.ProcessGroupGloo(prefixed, spec.rank, spec.world_size, opts)
            else:
                nccl = dist.ProcessGroupNCCL
                opts = nccl.Options()
                opts._timeout = timeout
                self._pg = nccl(prefixed, spec.rank, spec.world_size, opts)
        except Exception as e:
            raise TransferError(
                f"forming the {spec.backend} group {spec.store_prefix!r} (rank {spec.rank}/{spec.world_size}) "
                f"failed within {spec.timeout_s:g}s: {e}"
            ) from e

    def abort(self, reason: str = "aborted") -> None:
        """Fail every current and future wait on this group."""
        with self._lock:
            if not self._aborted.is_set():
                self._abort_reason = reason
            self._aborted.set()
            waiters = list(self._waiters)
            self._waiters.clear()
        for ev in waiters:
            ev.set()

    def _register(self, ev: threading.Event) -> None:
        with self._lock:
            if self._aborted.is_set():
                ev.set()
            else:
                self._waiters.add(ev)

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def post(self, buffer: torch.Tensor) -> "PendingBroadcast":
        """Start broadcasting ``buffer`` (contiguous uint8, same size on every rank) from rank 0."""
        if self._aborted.is_set():
            raise TransferError(f"group {self.spec.store_prefix!r} was aborted: {self._abort_reason}")
        timeout = datetime.timedelta(seconds=self.spec.timeout_s)
        pg = self._pg
        if pg is None:
            raise TransferError(f"group {self.spec.store_prefix!r} is closed")
        try:
            work = pg.broadcast(buffer, 0, timeout)
        except Exception as e:
            raise TransferError(f"posting a broadcast failed: {e}") from e
        return PendingBroadcast(self, work)

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Broadcast ``buffer`` from rank 0 and wait (deadline ``timeout_s``)."""
        self.post(buffer).wait()

    def close(self) -> None:
        """Stop using the group; release it in the background.

        Destroying a process group joins its worker threads, which first finish (or time out
        on) any collective still posted -- up to a deadline after a failed transfer. That
        must not stall the caller (the next epoch is being formed), so the last reference
        is dropped by a short-lived thread of its own.
        """
        self.abort("closed")
        with self._lock:
            pg, self._pg = self._pg, None
        if pg is not None:
            holder = [pg]
            del pg
            self.release_thread = threading.Thread(target=holder.clear, name="weights-group-release", daemon=True)
            self.release_thread.start()

    def join_release(self, timeout: float) -> bool:
        """Wait until the group is fully released (call before the process exits: a group
        still being destroyed when the interpreter ends aborts the process)."""
        t = self.release_thread
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True


class PendingBroadcast:
    """A posted broadcast; ``wait()`` returns when it completes or raises ``TransferError``."""

    def __init__(self, group: DataGroup, work: dist.Work):
        self._group = group
        self._work = work
        done = self._done = threading.Event()
        group._register(done)
        work.get_future().add_done_callback(lambda _f: done.set())  # captures only the event

    def wait(self, timeout_s: float | None = None) -> None:
        timeout_s = self._group.spec.timeout_s if timeout_s is None else timeout_s
        if not self._done.wait(timeout_s):
            self._group.abort(f"broadcast timed out after {timeout_s:g}s")
            raise TransferError(f"broadcast did not complete within {timeout_s:g}s")
        if self._group.aborted and not self._work.is_completed():
            raise TransferError(f"broadcast aborted: {self._group._abort_reason}")
        try:
            self._work.wait()
        except Exception as e:
            self._group.abort(str(e))
            raise TransferError(f"broadcast failed: {e}") from e
