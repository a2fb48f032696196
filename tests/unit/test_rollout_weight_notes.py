"""The worker-to-main-process notes of the weight channel (``rollout_svc.subscriber._Notes``):
an ``update <session> <version>`` note names the version that began, so the replica can
start loading it without asking the worker first; other notes only wake the loop."""

from __future__ import annotations

import asyncio
import socket

from rollout_svc.subscriber import _Notes


def _send(notes: _Notes, *payloads: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for p in payloads:
            s.sendto(p, notes.addr)


def test_update_note_carries_session_and_version() -> None:
    notes = _Notes()
    try:
        assert asyncio.run(notes.wait(0.05)) is False and notes.update is None
        _send(notes, b"welcome", b"update 77 3", b"update 77 4")
        assert asyncio.run(notes.wait(5.0)) is True
        assert notes.update == (77, 4)  # the last one: all waiting notes are consumed
        notes.update = None
        _send(notes, b"update", b"update x 5", b"fatal", b"update 1 2 3")
        assert asyncio.run(notes.wait(5.0)) is True
        assert notes.update is None  # malformed or other notes name nothing
    finally:
        notes.close()
