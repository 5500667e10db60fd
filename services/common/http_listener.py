"""The listening socket an HTTP server (uvicorn) is handed: TCP with Nagle's algorithm off on
every accepted connection, bound before the server starts so port 0 can be read back.

Knows sockets only; nothing of HTTP frameworks or the services that listen.
"""

from __future__ import annotations

import socket


def tcp_listener(host: str, port: int) -> socket.socket:
    """A non-blocking socket listening on host:port (0: any free port); OSError naming the
    address when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket says TCP; without it small SSE writes wait on Nagle's algorithm (~40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock
