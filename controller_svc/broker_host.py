"""The embedded queue broker hosted by ``meshrl run``'s controller, on a thread of its own.

With ``queues.type: embedded`` one machine needs no Redis: the controller hosts the
QueueService (:mod:`services.queues.broker_server`), with its append-only file in the run
dir, so nothing it acknowledged is lost when the controller is killed.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from services import auth


class BrokerThread:
    """The embedded broker on an event loop of its own thread: nothing the controller does
    (loading the data set, writing plots, waiting on a service) can keep the services
    from reaching their queues."""

    def __init__(self, host: str, port: int, aof_path: Path, credential: "auth.JobCredential | None" = None) -> None:
        self.host, self.port, self.aof_path, self.credential = host, port, aof_path, credential
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="embedded-broker", daemon=True)
        self.broker = None

    def start(self) -> "BrokerThread":
        from services.queues.broker_server import EmbeddedBroker

        self.thread.start()
        self.broker = asyncio.run_coroutine_threadsafe(
            EmbeddedBroker(host=self.host, port=self.port, aof_path=self.aof_path, credential=self.credential).start(),
            self.loop).result(120)
        return self

    async def ledger_counts(self) -> dict[str, int]:
        """How many samples of the broker's ledger are at each latest stage (read on its own
        loop; the broker keeps the counts as stages change, so this costs nothing per sample)."""

        async def read() -> dict[str, int]:
            return {stage: n for stage, n in self.broker.state.stage_counts.items() if n}

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(read(), self.loop))

    def stop(self) -> None:
        try:
            if self.broker is not None:
                asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
