"""Free TCP ports on this machine: one, or a base port with a whole layout of ports above it,
free at the moment of asking (another process may take one before it is bound: callers that
can, bind port 0 themselves). Knows sockets only; nothing of what will listen on the ports.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port free on `host` right now (also a port nothing listens on, for a refused call)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_layout(offsets: Sequence[int], attempts: int = 50, host: str = LOOPBACK) -> int:
    """A base port B such that B + each of `offsets` is free on `host` right now; OSError when
    `attempts` tries find none."""
    highest = max(offsets, default=0)
    for _ in range(attempts):
        base = free_port(host)
        if base + highest > 65535:
            continue
        try:
            for offset in offsets:
                if offset:
                    with socket.socket() as probe:
                        probe.bind((host, base + offset))
        except OSError:
            continue
        return base
    raise OSError(f"no base port on {host} with +{', +'.join(map(str, offsets))} free")
