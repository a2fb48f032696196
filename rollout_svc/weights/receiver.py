"""Replica side of the weight channel: ``WeightReceiver``.

A thin facade over three parts, each in a module of its own:

* :class:`~rollout_svc.weights.control.ControlStream` (``control.py``): the gRPC
  subscription. Its *reader* thread follows the control stream (reconnecting for
  ``connect_timeout_s`` when it breaks) and aborts the current group at once on ABORT; it
  keeps what the publisher announced (WELCOME, SERVE) and sends the ``Ack`` RPCs.
* :class:`~rollout_svc.weights.data_plane.DataPlane` (``data_plane.py``): its *worker*
  thread acts on each message in order: JOIN forms the epoch's data group, BEGIN starts an
  :class:`Update`, each BUCKET is received by broadcast (deadline on every one) into a fresh
  buffer and queued on the update, END completes it and acknowledges RECEIVED.
* :class:`~rollout_svc.weights.snapshot_client.SnapshotClient` (``snapshot_client.py``):
  ``fetch_snapshot()``.

The consumer (the rollout loop) calls ``wait_for_update(timeout)`` and iterates
``update.tensors()`` while buckets arrive; when a transfer fails, iteration raises
``TransferError`` and the replica catches up with ``fetch_snapshot()`` (or the next
version). ``report_loaded(version)`` tells the publisher which version it serves.

With the canary gate (``weights.rollout.mode: canary``) the publisher also says which
version this replica is to serve and whether it is a canary (SERVE): ``target`` holds
it; the consumer loads that version (by broadcast, or from ``fetch_snapshot()``, which
then streams that version), going back to it after a rejected candidate.
"""

from __future__ import annotations

from collections.abc import Callable

from services import auth
from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.weights.errors import TransferError
from services.weights.messages import check_replica_id

from rollout_svc.weights.control import ControlStream
from rollout_svc.weights.data_plane import DataPlane
from rollout_svc.weights.snapshot_client import Snapshot, SnapshotClient
from rollout_svc.weights.update import Handoff, Update

__all__ = ["Snapshot", "Update", "WeightReceiver"]


class WeightReceiver:
    """Receives policy versions for one replica (see module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, replica_id: str, address: str | None = None, served_version: int = -1,
                 served_session: int = 0, credential: auth.JobCredential | None = None,
                 on_event: Callable[[str], None] | None = None, serve_dtype: str = "", promoted_only: bool = False):
        """``serve_dtype``: announced to the publisher, the dtype this replica serves (see
        weights.wire_dtype). ``promoted_only``: announced too, never a canary, only promoted
        versions (the live-policy endpoint). ``on_event``: called (from the receiver's
        threads, must not block) with "update" when a version begins, "welcome" when a
        publisher (re)subscribed us, "serve" when the version to serve changed (canary
        mode), "fatal" on a fatal error."""
        self.cfg = cfg
        self.credential = auth.resolve(credential)  # every call to the publisher carries it
        self.replica_id = check_replica_id(replica_id)
        self.address = address or f"{cfg.host}:{cfg.control_port}"
        self.serve_dtype = serve_dtype
        self.promoted_only = promoted_only
        self._handoff = Handoff(self.replica_id, on_event)
        self.control = ControlStream(cfg, self.replica_id, self.address, self.credential, self._handoff,
                                     served_version=served_version, served_session=served_session,
                                     serve_dtype=serve_dtype, promoted_only=promoted_only)
        self.data = DataPlane(cfg, self.control)
        self.control.on_abort = self.data.abort_now
        self.snapshots = SnapshotClient(cfg, self.control)

    # ------------------------------------------------------------------ lifecycle
    def connect(self, timeout: float | None = None) -> "WeightReceiver":
        """Subscribe; returns once the publisher's WELCOME arrived (``TransferError`` otherwise)."""
        timeout = self.cfg.connect_timeout_s if timeout is None else timeout
        self.control.open()
        self.data.start()
        if not self.control.welcomed.wait(timeout):
            self.close()
            raise TransferError(f"no WELCOME from the weight publisher at {self.address} within {timeout:g}s")
        return self

    def close(self) -> None:
        """Unsubscribe and stop the receiver's threads."""
        self._handoff.closed.set()
        self.control.cancel()
        self.data.stop()
        self.control.stop()
        self.data.release_retired()
        self.control.close_channel()
        self._handoff.wake()

    def __enter__(self) -> "WeightReceiver":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    @property
    def served_version(self) -> int:
        return self.control.served

    @property
    def session(self) -> int:
        """The connected publisher's session (0 before its WELCOME). A publisher picks a new
        one each time it starts; version numbers are only ordered within one session."""
        return self.control.session

    @property
    def served_session(self) -> int:
        """Session the served version came from (0: unknown, e.g. the initial weights)."""
        return self.control.served_session

    @property
    def latest_version(self) -> int:
        return self.control.latest_version

    @property
    def snapshot_version(self) -> int:
        return self.control.snapshot_version

    @property
    def received_version(self) -> int:
        return self.data.received_version

    @property
    def dropped_updates(self) -> int:
        return self._handoff.dropped_updates

    @property
    def serve(self) -> tuple[int, bool, bool] | None:
        """Canary mode: ``(version to serve, is a canary, from_snapshot)`` of the last SERVE
        (see ``ControlStream.serve``); None in mode all or before it said anything."""
        return self.control.serve

    @property
    def target(self) -> tuple[int, bool] | None:
        """Canary mode: ``(version to serve, is a canary)`` of the last SERVE (see ``serve``)."""
        serve = self.control.serve
        return None if serve is None else serve[:2]

    @property
    def target_from_snapshot(self) -> bool:
        serve = self.control.serve
        return serve is not None and serve[2]

    # ------------------------------------------------------------------ consumer API
    def wait_for_update(self, timeout: float | None) -> Update | None:
        """The newest update not yet handed out, waiting up to ``timeout`` s (None = forever).

        Older updates nobody took are dropped (each version is complete weights). Raises the
        receiver's fatal error (e.g. ``VersionError``, a lost publisher) once it has one.
        """
        return self._handoff.take(timeout)

    def peek_update(self) -> tuple[int, int] | None:
        """``(session, version)`` of the update ``wait_for_update`` would hand out now, without
        taking it (None when there is none)."""
        return self._handoff.peek()

    def report_loaded(self, version: int, wait: bool = True) -> None:
        """Tell the publisher this replica now serves ``version`` of its session.

        Within one session versions never go backwards; a version of a new session may be
        lower than one served from an earlier session (a trainer resumed from a checkpoint).
        The check is done here; with ``wait=False`` the ``Ack`` RPC is sent by a background
        thread (in order, one at a time), so the caller -- the vLLM worker, which the engine
        waits for -- does not wait for the publisher's answer."""
        self.control.report_loaded(version, wait)

    def publisher_status(self, timeout: float | None = None) -> pb.StatusReply:
        """The publisher's ``Status`` (latest and snapshot versions, replicas); ``TransferError``
        when it cannot be reached."""
        return self.control.status(timeout)

    def fetch_snapshot(self, min_version: int = -1, timeout: float | None = None) -> Snapshot | None:
        """Download the publisher's latest snapshot (None when it has none >= ``min_version``).

        Raises ``SnapshotError`` for a broken stream or invalid bytes.
        """
        return self.snapshots.fetch(min_version, timeout)
