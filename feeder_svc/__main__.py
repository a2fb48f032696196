"""``python -m feeder_svc``: see :mod:`feeder_svc.server`."""

import os
import sys

from feeder_svc.server import main

if __name__ == "__main__":
    code = main()
    # Everything the feeder keeps is on disk by now (its position is written after every put,
    # its queues and server are closed): the interpreter's teardown of torch, gRPC and the
    # tokenizer would only burn about a CPU second at every job's end (docs/performance.md).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
