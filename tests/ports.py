"""Ports for the servers tests start (fake upstreams, gateways, vLLM, throwaway databases, the shared stack).

Asking the kernel for port 0 and closing the socket is racy: until the server binds it, the port is free for
anyone, and in a parallel run another worker's port-0 probe or any outgoing connection (which takes its local
port from the same ephemeral range) can get it first (seen with four workers: 23 errors of "address in use").
So ports come from below the ephemeral range (Linux: 32768-60999, never handed out for connections), from a
block of its own for each xdist worker, and are probed before they are handed out.
"""

import itertools
import os
import random
import socket

FIRST = 20000
BLOCK = 1000  # ports per worker: gw0 20000-20999, gw1 21000-21999, ...; a run outside xdist takes block 10
_OUTSIDE_XDIST = 10


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in a worker
    return int(worker[2:]) if worker.startswith("gw") else _OUTSIDE_XDIST


# A random start, so that two test runs side by side (both outside xdist, say) rarely probe the same ports.
_offsets = itertools.count(random.randrange(BLOCK))


def free_port() -> int:
    """A port nothing on 127.0.0.1 is bound to now, that no other worker of this run will be given."""
    start = FIRST + _block() * BLOCK
    for _ in range(BLOCK):
        port = start + next(_offsets) % BLOCK
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {start}-{start + BLOCK - 1}")
