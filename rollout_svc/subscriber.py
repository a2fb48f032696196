"""Follow the weight channel: load every new policy version into the running replica.

The channel's receiving side runs inside the vLLM worker (:mod:`rollout_svc.weight_stream`);
this loop, in the replica's main process, decides what it does, through the engine's
``collective_rpc``:

- at start (and after a failed transfer, or when the publisher changed) it catches up by
  loading the publisher's latest snapshot when that supersedes what the engine serves --
  this is how a replica that was down during a publish, or joined late, rejoins;
- otherwise it waits for the worker's note that a version began (a datagram on an
  abstract Unix socket, with a slow poll as a fallback), pauses the scheduler, has the
  worker stream the version into the model as it arrives, resumes, and reports the served
  version to the publisher.

A transfer that fails before any tensor reached the model leaves the engine on its old
version; one that fails later leaves it paused until a complete version (the snapshot,
or the next publish) is loaded. A version the worker refuses (wrong names/shapes) is
logged and skipped. Nothing here blocks the event loop.

With the canary gate (``weights.rollout.mode: canary``) the publisher also names the
version this replica is to serve (the worker's state has ``target_version``); then
:func:`serve_target` decides instead of the catch-up rules: the target arrives by broadcast
(a canary's candidate) or is loaded from the snapshot (a promotion, a canary's rollback
after a rejection, a late join), and a broadcast of any other version is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid

from rollout_svc.replica import Replica

log = logging.getLogger(__name__)


class ChannelLost(RuntimeError):
    """The worker's receiver lost the publisher (or was refused): reconnect."""


class _Notes:
    """The abstract Unix datagram socket the worker's receiver pokes (``update``, ...)."""

    def __init__(self) -> None:
        self.addr = f"\0meshrl-weights-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.addr)
        self.sock.setblocking(False)
        self.update: tuple[int, int] | None = None
        """``(session, version)`` of the last ``update <session> <version>`` note: a version
        that began arriving in the worker (the caller clears it when it takes it)."""

    def _read(self, data: bytes) -> None:
        parts = data.decode(errors="replace").split()
        if len(parts) == 3 and parts[0] == "update":
            try:
                self.update = (int(parts[1]), int(parts[2]))
            except ValueError:
                pass

    async def wait(self, timeout: float) -> bool:
        """True when a note arrived within ``timeout`` (all waiting notes are consumed)."""
        loop = asyncio.get_running_loop()
        try:
            self._read(await asyncio.wait_for(loop.sock_recv(self.sock, 64), timeout))
        except TimeoutError:
            return False
        while True:
            try:
                self._read(self.sock.recv(64))
            except BlockingIOError:
                return True

    def close(self) -> None:
        self.sock.close()


def _set_session(replica: Replica, session: int):
    """Callback for the engine: the served version's session changes with the version."""
    def on_loaded(res: dict) -> None:
        replica.weights_session = res.get("session") or session
    return on_loaded


def format_timing(timing: dict) -> str:
    """``key=seconds`` pairs of a load's timing report, for the log (None: not measured)."""
    return " ".join(f"{k}={v:.3f}" for k, v in timing.items() if isinstance(v, (int, float)))


async def _loaded(replica: Replica, res: dict) -> None:
    replica.weights_loaded()  # a canary starts the prompt groups it kept for this version
    replica.weight_updates += 1
    replica.metrics.weight_load.observe(replica.engine.last_weight_load_s)
    t0 = time.perf_counter()
    await replica.engine.weights.report_loaded(replica.engine.version)
    timing = dict(res.get("timing") or {}, loaded_rpc_s=time.perf_counter() - t0)
    log.info("replica %s now serves policy version %d (%.1f MB in %.3fs) timing %s", replica.name,
             replica.engine.version, res.get("bytes", 0) / 1e6, replica.engine.last_weight_load_s,
             format_timing(timing))


async def catch_up_from_snapshot(replica: Replica, session: int, timeout_s: float, target: int = -1,
                                 poll_s: float = 0.2, refused: set | None = None) -> bool:
    """Load the publisher's snapshot if it supersedes the served version; True if loaded.

    ``target``: a version known to exist (e.g. one whose transfer just failed); its snapshot
    may still be being written, so we poll for it until ``timeout_s``. A publisher of another
    session than the served weights' (a restarted trainer) is followed whatever its version.
    A replica whose weights are mixed (``weights_dirty``) takes the snapshot of its own
    version too, since anything complete beats what it has. ``refused``: (session, version)
    pairs found bad before; their snapshot is not fetched again.
    """
    refused = set() if refused is None else refused
    engine = replica.engine
    deadline = time.monotonic() + timeout_s
    while True:
        if replica.other_line(session):
            min_version = -1
        elif engine.weights_dirty:
            min_version = max(target, engine.version)
        else:
            min_version = engine.version + 1
        snap_v = await engine.weights.snapshot_version()
        if snap_v >= 0 and snap_v >= min_version and (session, snap_v) not in refused:
            res = await engine.weights.load_snapshot(min_version, max(1.0, deadline - time.monotonic()),
                                                     _set_session(replica, session))
            if res is not None and res.get("ok"):
                await _loaded(replica, res)
                log.info("replica %s caught up to v%d from the snapshot", replica.name, engine.version)
                return True
            if res is not None:
                log.warning("replica %s: loading the snapshot failed: %s", replica.name, res.get("error"))
                if res.get("refused"):
                    refused.add((session, snap_v))
        if engine.version >= target or time.monotonic() >= deadline:
            return False  # (a dirty engine without a target tries once: the next version may come)
        await asyncio.sleep(poll_s)
        if (await engine.weights.channel_state()).get("pending_version") is not None:
            return False  # a new version is arriving: load that instead


class _Expected:
    """A canary's candidate, expected by broadcast: when its SERVE was first seen."""

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.since = 0.0

    def waiting(self, key: tuple[int, int], patience_s: float) -> bool:
        """True while the broadcast of ``key`` (session, version) may still begin."""
        if key != self.key:
            self.key, self.since = key, time.monotonic()
        return time.monotonic() - self.since < patience_s

    def give_up(self) -> None:
        self.since = float("-inf")


async def serve_target(replica: Replica, st: dict, session: int, timeout_s: float, notes: "_Notes", poll_s: float,
                       refused: set, expected: _Expected) -> bool:
    """Canary mode: bring the engine to the version the publisher says it is to serve.

    Returns False when that version is pending in the worker (its broadcast): the caller
    streams it in; True when this call did the step (loaded the target's snapshot, skipped
    another version's broadcast, or waited)."""
    engine = replica.engine
    target, canary = int(st["target_version"]), bool(st["canary"])
    pending = st.get("pending_version")
    if pending is not None:
        if pending == target and st.get("pending_session") == session and (
                replica.supersedes(target, session) or engine.weights_dirty):
            return False
        await engine.weights.skip_update(pending)  # not this replica's version: receive it, keep serving
        return True
    if engine.version == target and not replica.other_line(session) and not engine.weights_dirty:
        await notes.wait(poll_s)
        return True
    newer = target > engine.version and not replica.other_line(session) and not engine.weights_dirty
    # a canary waits for its candidate's broadcast, unless the publisher said it went out without it
    wait = canary and newer and not st.get("target_from_snapshot")
    if (wait and expected.waiting((session, target), timeout_s)) or (session, target) in refused:
        await notes.wait(min(poll_s, 1.0))  # the candidate's broadcast is on its way
        return True
    res = await engine.weights.load_snapshot(target, timeout_s, _set_session(replica, session), abort=canary)
    if res is not None and res.get("ok"):
        await _loaded(replica, res)
        log.info("replica %s serves v%d (%s, from the snapshot)", replica.name, engine.version,
                 "canary" if canary else "promoted")
        return True
    if res is not None:
        log.warning("replica %s: loading the snapshot of v%d failed: %s", replica.name, target, res.get("error"))
        if res.get("refused"):
            refused.add((session, target))
    await notes.wait(min(poll_s, 1.0))  # (no snapshot yet, or the target moved: ask again)
    return True


#: How often the loop asks the worker for its channel state without a note from it (a lost
#: note's worst delay). Every ask is a ``collective_rpc``, after which vLLM's worker busy-polls
#: its message queue for one second; asking every second kept an idle replica's worker
#: spinning on a whole core for ever -- on a shared machine it starved the other replicas'
#: workers (vLLM binds them all to the same core by default). Notes (welcome, update, fatal)
#: wake the loop at once, so the fallback can be slow.
STATE_POLL_S = 5.0


async def follow_updates(replica: Replica, cfg, notes: _Notes, stop: asyncio.Event, poll_s: float = STATE_POLL_S) -> None:
    """Apply updates from the worker's connected receiver until ``stop`` is set."""
    engine = replica.engine
    timeout = cfg.transfer_timeout_s
    needs_catch_up, target = True, -1
    session = None
    refused: set[tuple[int, int]] = set()  # versions found bad: never fetched again
    expected = _Expected()
    # Canary mode: every load asks the worker's state first -- whether this replica is a canary
    # (its in-flight requests are then aborted and regenerated, so no sample made with a
    # candidate's weights carries an older version) is only as fresh as the last state read.
    fast_path = not getattr(getattr(cfg, "rollout", None), "mode", "all") == "canary"
    while not stop.is_set():
        hint, notes.update = notes.update, None
        if (fast_path and hint is not None and hint[0] == session and not needs_catch_up and not engine.weights_dirty
                and replica.supersedes(hint[1], hint[0])):
            # The worker's note named a newer version of this publisher: load it right away,
            # without first asking the worker's state (one RPC less on every update; the
            # worker says so if another version is pending by then).
            vsession, version = hint
        else:
            st = await engine.weights.channel_state()
            if st.get("fatal"):
                if st.get("fatal_kind") == "version":
                    log.error("replica %s: %s", replica.name, st["fatal"])
                else:
                    raise ChannelLost(st["fatal"])
            if not st["session"]:  # not welcomed yet
                await notes.wait(poll_s)
                continue
            if st["session"] != session:  # first WELCOME, or a restarted publisher
                session, needs_catch_up, target = st["session"], True, -1
            replica.weights_canary = st.get("canary")
            if st.get("target_version") is not None:  # canary mode: the publisher names the version
                needs_catch_up = False  # (serve_target catches up)
                if await serve_target(replica, st, session, timeout, notes, poll_s, refused, expected):
                    continue
                version, vsession = st["pending_version"], session
            elif needs_catch_up or engine.weights_dirty:
                await catch_up_from_snapshot(replica, session, timeout, target, refused=refused)
                needs_catch_up, target = False, -1
                if engine.weights_dirty and st.get("pending_version") is None:
                    await notes.wait(poll_s)  # nothing complete to load yet: wait for the next version
                    continue
            if st.get("target_version") is None:  # mode all: any newer version
                version, vsession = st.get("pending_version"), st.get("pending_session")
                if version is None:
                    await notes.wait(poll_s)
                    continue
                if not replica.supersedes(version, vsession) and not engine.weights_dirty:
                    await engine.weights.skip_update(version)  # receive it, keep serving
                    continue
        rollback = replica.other_line(vsession) or engine.weights_dirty
        res = await engine.weights.load_from_channel(version, rollback=rollback, on_loaded=_set_session(replica, vsession),
                                             abort=bool(replica.weights_canary))
        if res.get("not_pending"):
            continue  # the note was stale (a newer version began, or it was taken): ask the worker
        if res.get("ok"):
            await _loaded(replica, res)
        elif res.get("refused"):
            refused.add((vsession, version))
            log.error("replica %s: refused v%d: %s", replica.name, version, res.get("error"))
        else:
            log.warning("replica %s: transfer of v%d failed (%s); catching up via snapshot",
                        replica.name, version, res.get("error"))
            needs_catch_up, target = True, version
            expected.give_up()  # canary mode: its snapshot, not another broadcast


async def run_weight_subscriber(replica: Replica, cfg, name: str, stop: asyncio.Event) -> None:
    """Subscribe the engine's workers to the publisher described by ``cfg``
    (WeightChannelConfig) and follow it, reconnecting after the channel is lost, until
    ``stop`` is set."""
    engine = replica.engine
    notes = _Notes()
    try:
        while not stop.is_set():
            try:
                await engine.weights.open_channel(cfg, name, replica.weights_session, notes.addr, replica.promoted_only)
                await follow_updates(replica, cfg, notes, stop)
            except Exception as exc:  # noqa: BLE001 -- the channel failed: reconnect (RPC errors included)
                if not engine.healthy:
                    raise
                log.warning("replica %s: weight channel: %s; reconnecting", replica.name, exc)
                await asyncio.sleep(1.0)
            finally:
                try:
                    await engine.weights.close_channel()
                except Exception:  # noqa: BLE001
                    log.debug("closing the weight channel failed", exc_info=True)
    finally:
        notes.close()
