"""Follow the weight channel: load every new policy version into the running replica.

``run_weight_subscriber`` connects a ``services.weights.WeightReceiver`` and loops:

- at start (and after any failed transfer) it catches up by fetching the publisher's latest
  snapshot when that is newer than what the engine serves -- this is how a replica that was
  down during a publish, or joined late, rejoins;
- otherwise it waits for the next ``Update`` and streams its tensors into the engine
  (``Replica.apply_weights``: validate + stage, pause, load in place, resume), then reports
  the served version to the publisher.

A transfer that fails mid-way (``TransferError``) leaves the engine on its old version; a
version the engine refuses (``WeightUpdateError``: wrong names/shapes) is logged and
skipped. The receiver's blocking calls run in worker threads with deadlines; nothing here
blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging

from rollout_svc.replica import Replica
from rollout_svc.weights import WeightUpdateError

log = logging.getLogger(__name__)


async def catch_up_from_snapshot(replica: Replica, rx, timeout_s: float, target: int = -1, poll_s: float = 0.2) -> bool:
    """Load the publisher's snapshot if it supersedes the served version; True if loaded.

    ``target``: a version known to exist (e.g. one whose transfer just failed); its snapshot
    may still be being written, so we poll for it until ``timeout_s``. A publisher of another
    session than the served weights' (a restarted trainer) is followed whatever its version.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        left = max(0.1, deadline - time.monotonic())
        session = rx.session
        min_version = -1 if replica.other_line(session) else replica.engine.version + 1
        snap = await asyncio.to_thread(rx.fetch_snapshot, min_version, left)
        if snap is not None and replica.supersedes(snap.version, session):
            await replica.apply_weights(snap.version, snap.tensors(), session=session)
            rx.report_loaded(snap.version)
            log.info("replica %s caught up to v%d from the snapshot", replica.name, snap.version)
            return True
        if replica.engine.version >= target or time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)


async def follow_updates(replica: Replica, rx, stop: asyncio.Event, poll_s: float = 0.5) -> None:
    """Apply updates from a connected receiver until ``stop`` is set."""
    from services.weights import SnapshotError, TransferError, VersionError

    timeout = rx.cfg.transfer_timeout_s
    needs_catch_up, target = True, -1
    session = rx.session
    while not stop.is_set():
        if rx.session != session:  # the receiver reconnected to a restarted publisher
            session, needs_catch_up, target = rx.session, True, -1
        if needs_catch_up:
            try:
                await catch_up_from_snapshot(replica, rx, timeout, target)
                needs_catch_up = False
            except (SnapshotError, TransferError, WeightUpdateError) as exc:
                log.warning("replica %s: snapshot catch-up failed: %s; retrying", replica.name, exc)
                await asyncio.sleep(poll_s)
                continue
        try:
            update = await asyncio.to_thread(rx.wait_for_update, poll_s)
        except VersionError as exc:
            log.error("replica %s: %s", replica.name, exc)
            continue
        if update is None:
            continue
        if not replica.supersedes(update.version, update.session):
            await asyncio.to_thread(lambda: sum(1 for _ in update.tensors()))  # drain, keep serving
            continue
        try:
            await replica.apply_weights(update.version, update.tensors(), session=update.session)
            rx.report_loaded(update.version)
        except TransferError as exc:
            log.warning("replica %s: transfer of v%d failed (%s); catching up via snapshot",
                        replica.name, update.version, exc)
            needs_catch_up, target = True, update.version
        except WeightUpdateError as exc:
            log.error("replica %s: refused v%d: %s", replica.name, update.version, exc)


async def run_weight_subscriber(replica: Replica, cfg, name: str, stop: asyncio.Event) -> None:
    """Connect to the publisher described by ``cfg`` (WeightChannelConfig) and follow it,
    reconnecting after the channel is lost, until ``stop`` is set."""
    from services.weights import WeightChannelError, WeightReceiver

    while not stop.is_set():
        rx = WeightReceiver(cfg, name, served_version=replica.engine.version, served_session=replica.weights_session)
        try:
            await asyncio.to_thread(rx.connect)
            await follow_updates(replica, rx, stop)
        except WeightChannelError as exc:
            log.warning("replica %s: weight channel: %s; reconnecting", replica.name, exc)
            await asyncio.sleep(1.0)
        finally:
            await asyncio.to_thread(rx.close)
