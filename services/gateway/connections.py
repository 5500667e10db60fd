"""The gateway's connection limits on the wire: deadlines for a request's headers and body, an
idle keep-alive timeout, and caps on open connections, in all and per client address, so that slow
or half-open connections cannot hold the front door's descriptors.

How: uvicorn closes an idle kept-alive connection (`timeout_keep_alive`) but has no deadline for
headers or a body and no connection cap (its `limit_concurrency` answers 503 only once a request
is read, while the connection already holds a descriptor). So the gateway adds two small pieces
and wraps no event loop:

- `GuardedListener`, the listening socket uvicorn is handed: asyncio calls its `accept()`, which
  admits each new connection into the guard or refuses it there and then, before asyncio makes a
  transport, a task and a protocol for it (a refusal costs a few microseconds, and every accepted
  descriptor is either counted under the cap or already closed; asyncio accepts up to its backlog
  of connections per wake-up, which would otherwise all hold descriptors before a protocol could
  refuse them).
- `GuardedHttpProtocol`, a subclass of uvicorn's httptools protocol that hooks its parser's
  callbacks (message begin, headers complete, message complete, response complete) for the
  deadlines, and tells the guard when a connection is busy, idle again, or closed.

`ConnectionGuard` (connection_guard.py) counts and decides (admit, make room, refuse) with no I/O;
this module carries its decisions out.

- A refused connection is answered 503 with Retry-After if its request is already there, else
  closed.
- Headers must be in within `header_timeout_s` of the connection opening (of a request's first
  byte on a kept-alive connection) and within MAX_HEADER_BYTES (else 431); the body within
  `body_timeout_s` of the headers (else 408). Either closes the connection.

Knows sockets, uvicorn's httptools protocol and the guard; nothing of the routes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr

from services.gateway.connection_guard import (
    BODY_TIMEOUT,
    CLOSES,
    HEADER_TIMEOUT,
    HEADERS_TOO_LARGE,
    IDLE_TIMEOUT,
    REFUSALS,
    ConnectionGuard,
)

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024  # a request line and headers larger: 431, closed
LOG_EVERY_S = 10.0  # refusals and timeouts are logged at most this often
# connections accepted (admitted or refused) per turn of the event loop; then it runs its other
# work before accepting more (the kernel's accept queue holds the rest): asyncio would take up to
# its backlog (2048) at once, and 2,048 admissions in a row stalled the loop for ~50 ms
ACCEPTS_PER_TURN = 64


class _LogLimiter:
    """One log line per LOG_EVERY_S at most, with the counts since the last one."""

    def __init__(self) -> None:
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + LOG_EVERY_S
        return True


def _response(status: str, headers: list[tuple[str, str]], body: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
    lines += [f"content-length: {len(body)}", "connection: close", "", ""]
    return "\r\n".join(lines).encode("ascii") + body


def _error_body(message: str, code: str) -> bytes:
    """OpenAI's error shape, as the gateway's other errors."""
    escaped = message.replace('"', "'")
    return (
        f'{{"error": {{"message": "{escaped}", "type": "server_error", "param": null, '
        f'"code": "{code}"}}}}'
    ).encode()


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under the gateway's connection limits (module docstring).
    `guard` is set on the subclass `protocol_class` makes for one server."""

    guard: ClassVar[ConnectionGuard[GuardedHttpProtocol]]
    _logs: ClassVar[_LogLimiter]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.guard.limits.keepalive_timeout_s  # type: ignore[assignment]
        self._admitted = False
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "headers" or "body" while a deadline runs
        self._header_bytes = 0

    # asyncio's protocol callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is None or not self.guard.adopt(sock.fileno(), self):
            # not accepted by a GuardedListener (another listening socket): admitted here
            address = get_remote_addr(transport)
            admission = self.guard.admit(self, address[0] if address else "")
            if admission.make_room is not None:
                admission.make_room.transport.close()
            if admission.refused is not None:
                transport.abort()
                return
            self.guard.adopt(self, self)
        self._admitted = True
        super().connection_made(transport)
        self._start(HEADER_TIMEOUT, self.guard.limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._phase == HEADER_TIMEOUT and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                answer = self.cycle is None or self.cycle.response_complete
                status = "431 Request Header Fields Too Large" if answer else None
                self._close(HEADERS_TOO_LARGE, status)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        if self._admitted:
            self.guard.release(self)
            super().connection_lost(exc)

    # the parser's callbacks (inside data_received)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase is None:  # a later request on a kept-alive connection
            self._start(HEADER_TIMEOUT, self.guard.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self.guard.busy(self)
        self._start(BODY_TIMEOUT, self.guard.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._stop()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.guard.idle(self)

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.guard.closed[IDLE_TIMEOUT] += 1
        super().timeout_keep_alive_handler()

    # deadlines

    def _start(self, phase: str, seconds: float) -> None:
        self._stop()
        self._phase = phase
        self._header_bytes = 0
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = None
        self._phase = None

    def _expired(self) -> None:
        phase, self._deadline, self._phase = self._phase, None, None
        if phase == BODY_TIMEOUT:
            answer = self.cycle is not None and not self.cycle.response_started
            self._close(BODY_TIMEOUT, "408 Request Timeout" if answer else None)
        elif phase is not None:
            self._close(phase, None)

    def _close(self, reason: str, status: str | None) -> None:
        """Closes the connection for `reason`, answering `status` first if given."""
        self._stop()
        self.guard.closed[reason] += 1
        self.guard.release(self)
        if status is not None:
            message = f"{status.partition(' ')[2].lower()} ({reason.replace('_', ' ')})"
            body = _error_body(message, reason)
            self.transport.write(_response(status, [("content-type", "application/json")], body))
        if self._logs.due():
            log.warning(
                "closed a connection from %s: %s (since start: %s; refused %s)",
                self.client[0] if self.client else "?",
                reason.replace("_", " "),
                dict(self.guard.closed),
                dict(self.guard.refused),
            )
        self.transport.close()


class GuardedListener(socket.socket):
    """The gateway's listening socket (module docstring): asyncio's accept loop calls `accept`,
    which returns admitted connections only. `guard` is set by `guarded_listener`."""

    guard: ConnectionGuard[GuardedHttpProtocol]
    logs: _LogLimiter
    refusal: bytes  # the 503 a refused connection whose request is already there gets

    turn_left: int = ACCEPTS_PER_TURN  # accepts left in this turn of the event loop

    def accept(self) -> tuple[socket.socket, Any]:
        while True:
            if self.turn_left <= 0:
                # more may be waiting: the socket stays readable, asyncio comes back next turn
                raise BlockingIOError(errno.EAGAIN, "accepted a turn's worth of connections")
            if self.turn_left == ACCEPTS_PER_TURN:
                asyncio.get_running_loop().call_soon(self._next_turn)
            self.turn_left -= 1
            conn, address = super().accept()  # BlockingIOError once none is waiting
            host = address[0] if isinstance(address, tuple) else ""
            admission = self.guard.admit(conn.fileno(), host)
            if admission.refused is None:
                if admission.make_room is not None:
                    admission.make_room.transport.close()
                return conn, address
            self._refuse(conn, admission.refused, host)

    def _next_turn(self) -> None:
        self.turn_left = ACCEPTS_PER_TURN

    def _refuse(self, conn: socket.socket, reason: str, host: str) -> None:
        """503 with Retry-After if the request is already there, then closed; else closed."""
        try:
            if conn.recv(65536, socket.MSG_DONTWAIT):
                conn.send(self.refusal, socket.MSG_DONTWAIT)
                self.guard.answered_503 += 1
        except OSError:  # nothing to read yet, or the client is gone
            pass
        conn.close()
        if self.logs.due():
            log.warning(
                "refusing connections (%s, last from %s): %d open, cap %d, %d per client; "
                "refused since start: %s",
                reason,
                host,
                self.guard.open,
                self.guard.limits.max_connections,
                self.guard.limits.max_connections_per_client,
                dict(self.guard.refused),
            )


def guarded_listener(
    sock: socket.socket, guard: ConnectionGuard[GuardedHttpProtocol]
) -> GuardedListener:
    """`sock` (a listening TCP socket, detached: do not use it after) as a GuardedListener."""
    listener = GuardedListener(fileno=sock.detach())
    listener.setblocking(False)
    listener.guard = guard
    listener.logs = _LogLimiter()
    body = _error_body("the gateway is at its connection limit; retry later", "overloaded")
    headers = [
        ("content-type", "application/json"),
        ("retry-after", str(guard.limits.retry_after_s)),
    ]
    listener.refusal = _response("503 Service Unavailable", headers, body)
    return listener


def protocol_class(guard: ConnectionGuard[GuardedHttpProtocol]) -> type[GuardedHttpProtocol]:
    """A GuardedHttpProtocol subclass bound to `guard`: uvicorn's `http` setting for one server."""

    class BoundProtocol(GuardedHttpProtocol):
        pass

    BoundProtocol.guard = guard
    BoundProtocol._logs = _LogLimiter()
    return BoundProtocol


class ConnectionMetrics(Collector):
    """The guard's counts as Prometheus metrics, read at each scrape."""

    def __init__(self, guard: ConnectionGuard[Any]) -> None:
        self._guard = guard

    def collect(self) -> Iterator[Metric]:
        guard = self._guard
        yield GaugeMetricFamily(
            "tiermesh_gateway_open_connections", "HTTP connections open", value=guard.open
        )
        limits = GaugeMetricFamily(
            "tiermesh_gateway_connection_limit",
            "Connection caps: in all, and per client address",
            labels=["scope"],
        )
        limits.add_metric(["all"], guard.limits.max_connections)
        limits.add_metric(["per_client"], guard.limits.max_connections_per_client)
        yield limits
        refused = CounterMetricFamily(
            "tiermesh_gateway_connections_refused",
            "Connections refused as accepted, by the cap they met",
            labels=["reason"],
        )
        for reason in REFUSALS:
            refused.add_metric([reason], guard.refused[reason])
        yield refused
        yield CounterMetricFamily(
            "tiermesh_gateway_refusal_responses",
            "Refused connections whose request was answered 503 with Retry-After",
            value=guard.answered_503,
        )
        closed = CounterMetricFamily(
            "tiermesh_gateway_connections_closed",
            "Connections the gateway closed: deadlines, idle keep-alive, room for a new one, "
            "oversized headers",
            labels=["reason"],
        )
        for reason in CLOSES:
            closed.add_metric([reason], guard.closed[reason])
        yield closed
