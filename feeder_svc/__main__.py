"""``python -m feeder_svc``: see :mod:`feeder_svc.server`."""

import sys

from feeder_svc.server import main

if __name__ == "__main__":
    sys.exit(main())
