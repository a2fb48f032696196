"""The receiver's control stream: its gRPC subscription to the publisher's ``WeightService``.

:class:`ControlStream` owns the gRPC channel and a *reader* thread that follows the
``Subscribe`` stream (re-subscribing for ``connect_timeout_s`` when it breaks) and passes
every message, in order, to the data plane's worker (``inbox``); an ABORT also reaches the
data plane at once (``on_abort``), so a blocked wait wakes. It keeps what the publisher of
this session announced -- WELCOME (its session, latest and snapshot versions) and, in canary
mode, SERVE (the version this replica is to serve) -- and what this replica announces back:
the version it serves (``report_loaded``, the ``Ack`` RPC) and ``Status``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import grpc

from services import auth
from services.config.weights import WeightChannelConfig
from services.pb import weights_pb2 as pb
from services.pb import weights_pb2_grpc as pb_grpc
from services.weights.errors import TransferError, VersionError, WeightChannelError
from services.weights.messages import CLIENT_OPTIONS

from rollout_svc.weights.update import Handoff

log = logging.getLogger("rollout_svc.weights.receiver")
K = pb.ControlKind
_STOP = object()


class ControlStream:
    """The subscription, the acknowledgements and the publisher's announcements (module docstring)."""

    def __init__(self, cfg: WeightChannelConfig, replica_id: str, address: str, credential: auth.JobCredential,
                 handoff: Handoff, *, served_version: int, served_session: int, serve_dtype: str,
                 promoted_only: bool):
        self.cfg = cfg
        self.replica_id = replica_id
        self.address = address
        self.credential = credential
        self.handoff = handoff
        self.serve_dtype = serve_dtype
        self.promoted_only = promoted_only
        self.inbox: queue.Queue = queue.Queue()
        """Every control message, in order, for the data plane's worker thread."""
        self.on_abort: Callable[[str, pb.ControlMessage | None], None] = lambda reason, msg: None
        """Called from the reader thread on ABORT (with the message) and when the stream broke."""
        self.stub: pb_grpc.WeightServiceStub | None = None
        self._channel: grpc.Channel | None = None
        self._call = None
        self._reader: threading.Thread | None = None
        self.session = 0
        self.served = served_version
        self.served_session = served_session
        self.latest_version = -1
        self.snapshot_version = -1
        self.welcomed = threading.Event()
        self.serve: tuple[int, bool, bool] | None = None
        """Canary mode: ``(version to serve, is a canary, from_snapshot)`` as the publisher of
        this session last said (SERVE), replaced whole so a reader never mixes two messages;
        ``from_snapshot``: the version's broadcast is over without this replica, load it from
        the snapshot instead of waiting for it. None in mode all or before it said anything."""
        self._told_back: set[int] = set()
        """Canary mode: versions this session's publisher named (SERVE) below the one served --
        rollbacks. Loading one may take longer than the publisher takes to name the next
        candidate, so the report is checked against every rollback named, not only the last."""
        self._acks: queue.Queue = queue.Queue()  # report_loaded(wait=False): LOADED acks to send
        self._ack_thread: threading.Thread | None = None
        self._ack_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Open the channel and start the reader thread."""
        self._channel = auth.channel(self.address, self.credential, options=CLIENT_OPTIONS)
        self.stub = pb_grpc.WeightServiceStub(self._channel)
        self._reader = threading.Thread(target=self._read_loop, name=f"weights-reader-{self.replica_id}", daemon=True)
        self._reader.start()

    def cancel(self) -> None:
        """End the subscription (the receiver is closing)."""
        if self._call is not None:
            self._call.cancel()

    def stop(self) -> None:
        """Stop the ack and reader threads (after ``cancel``)."""
        if self._ack_thread is not None:
            self._acks.put(_STOP)
            self._ack_thread.join(timeout=5.0)
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=5.0)

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()

    # ------------------------------------------------------------------ the reader thread
    def _read_loop(self) -> None:
        closed = self.handoff.closed
        broken_since: float | None = None
        while not closed.is_set():
            req = pb.SubscribeRequest(replica_id=self.replica_id, served_version=self.served,
                                      served_session=self.served_session, serve_dtype=self.serve_dtype,
                                      promoted_only=self.promoted_only)
            try:
                self._call = self.stub.Subscribe(req)  # type: ignore[union-attr]
                for msg in self._call:
                    broken_since = None
                    if msg.kind == K.CONTROL_KIND_ABORT:
                        self.on_abort(msg.abort.reason or "aborted by the publisher", msg)
                    self.inbox.put(msg)
            except grpc.RpcError as e:
                if closed.is_set():
                    return
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    self.handoff.set_fatal(WeightChannelError(f"publisher refused the subscription: {e.details()}"))
                    return
            if closed.is_set():
                return
            # The stream broke: the publisher restarted or the network failed. Drop the group.
            self.on_abort("control stream lost", None)
            broken_since = broken_since or time.monotonic()
            if time.monotonic() - broken_since > self.cfg.connect_timeout_s:
                self.handoff.set_fatal(TransferError(f"lost the weight publisher at {self.address} for "
                                                     f"{self.cfg.connect_timeout_s:g}s"))
                return
            closed.wait(0.5)

    # ------------------------------------------------------------------ announcements (worker thread, in order)
    def welcome(self, msg: pb.ControlMessage) -> None:
        """WELCOME: a (new) publisher subscribed us; a new session starts versions over."""
        if msg.session != self.session:
            self.session = msg.session
            self.serve = None
            self._told_back.clear()
        self.latest_version = msg.welcome.latest_version
        self.snapshot_version = msg.welcome.snapshot_version
        self.welcomed.set()
        self.handoff.event("welcome")

    def serve_told(self, msg: pb.ControlMessage) -> None:
        """SERVE (canary mode): the version this replica is to serve, and its role."""
        with self.handoff.cond:
            self.serve = (msg.policy_version, msg.serve.canary, msg.serve.from_snapshot)
            if msg.policy_version < self.served:
                self._told_back.add(msg.policy_version)
            self.handoff.cond.notify_all()
        self.handoff.event("serve")

    # ------------------------------------------------------------------ what the replica tells
    def report_loaded(self, version: int, wait: bool = True) -> None:
        """See ``WeightReceiver.report_loaded``."""
        with self.handoff.cond:  # SERVE messages update serve and _told_back under it
            same_line = self.served_session in (0, self.session)
            told_back = version in self._told_back or (self.serve is not None and self.serve[0] == version)
            if version < self.served and same_line and not told_back:
                raise VersionError(f"report_loaded({version}) after already serving v{self.served}")
            self.served, self.served_session = version, self.session
            self._told_back = {v for v in self._told_back if v > version}
        if wait:
            self.ack(pb.ACK_STATUS_LOADED, 0, version)
            return
        with self._ack_lock:
            if self._ack_thread is None:
                self._ack_thread = threading.Thread(target=self._ack_loop, name=f"weights-ack-{self.replica_id}",
                                                    daemon=True)
                self._ack_thread.start()
        self._acks.put(version)

    def _ack_loop(self) -> None:
        while True:
            version = self._acks.get()
            if version is _STOP:
                return
            self.ack(pb.ACK_STATUS_LOADED, 0, version)

    def ack(self, status: int, epoch: int, version: int, message: str = "") -> None:
        """The ``Ack`` RPC (a failure is logged: the publisher's deadline covers a lost ack)."""
        if self.stub is None or self.handoff.closed.is_set():
            return
        req = pb.AckRequest(replica_id=self.replica_id, session=self.session if status != pb.ACK_STATUS_LOADED else 0,
                            epoch=epoch, policy_version=version, status=status, message=message[:2000])
        try:
            self.stub.Ack(req, timeout=self.cfg.transfer_timeout_s)
        except grpc.RpcError as e:
            log.warning("%s: Ack(%s v%d) failed: %s", self.replica_id, pb.AckStatus.Name(status), version, e.code())

    def status(self, timeout: float | None = None) -> pb.StatusReply:
        """See ``WeightReceiver.publisher_status``."""
        if self.stub is None:
            raise WeightChannelError("connect() first")
        try:
            return self.stub.Status(pb.StatusRequest(), timeout=self.cfg.connect_timeout_s if timeout is None else timeout)
        except grpc.RpcError as e:
            raise TransferError(f"Status of the weight publisher failed: {e.code().name}") from e
