"""A store of its own for an elastic job started by hand (no launcher to host it).

    python -m pycollective.elastic._storehost HOST PORT IDLE_SECONDS

The first member that finds no store at MASTER_ADDR:MASTER_PORT starts this process in a
session of its own, so the store outlives that member: losing any member, the one that
started it included, loses nothing. It serves until no client has been connected for
IDLE_SECONDS (after the first one came), and exits quietly if the port is taken (another
member's store host won the race). The secret is the job's (PYCOLLECTIVE_SECRET).

When the last client leaves, the store forgets every key at once: no member is alive to
need them (every member holds its connection for its whole life), and a job started again
on the same port must not read the last one's rounds, decisions or end.
"""

from __future__ import annotations

import os
import sys
import time

from .._errors import StoreError
from ..store import TCPStoreServer

_POLL = 0.25


def serve(host: str, port: int, idle: float) -> int:
    try:
        server = TCPStoreServer(host, port).start()
    except StoreError:
        return 0  # someone else hosts it
    quiet_since = time.monotonic()
    seen = False
    cleared = 0.0
    try:
        while True:
            time.sleep(_POLL)
            if server.connections:
                seen = True
                quiet_since = time.monotonic()
            elif seen and quiet_since > cleared:
                server.clear()
                cleared = time.monotonic()
            elif time.monotonic() - quiet_since > (idle if seen else 4 * idle):
                return 0
    finally:
        server.close()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    host, port, idle = argv[0], int(argv[1]), float(argv[2])
    os.environ.pop("PYCOLLECTIVE_FLIGHT_DIR", None)
    return serve(host, port, idle)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
