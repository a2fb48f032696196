"""Run the embedded queue broker as its own process.

    python -m services.queues --port 50070 [--host 127.0.0.1] [--aof queues.aof] [--fsync]

Prints ``queue broker listening on HOST:PORT`` once serving; SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m services.queues", description="meshrl embedded queue broker (gRPC QueueService)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50070, help="port to bind (0 = any free port)")
    p.add_argument("--aof", default=None, help="append-only file; a restart then loses nothing acknowledged")
    p.add_argument("--fsync", action="store_true", help="fsync the append-only file before every reply")
    p.add_argument("--max-frame-bytes", type=int, default=1 << 30, help="largest frame accepted")
    p.add_argument("--credential-file", default=None,
                   help="file holding the job credential every call must carry (default: $MESHRL_JOB_CREDENTIAL_FILE)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import asyncio
    import logging
    import signal

    from services import auth
    from services.queues.broker_server import EmbeddedBroker

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    credential = auth.install(args.credential_file)

    async def run() -> None:
        broker = EmbeddedBroker(host=args.host, port=args.port, aof_path=args.aof, fsync=args.fsync,
                                max_frame_bytes=args.max_frame_bytes, credential=credential)
        await broker.start()
        print(f"queue broker listening on {broker.address}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await broker.stop()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
