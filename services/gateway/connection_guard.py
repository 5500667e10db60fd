"""The gateway's connection guard as a decision with no I/O: which connections are open, from
which client address, which of them are idle and since when; whether a new one is admitted, makes
room by closing an idle one, or is refused; and the counts /metrics shows.

- A connection is admitted while fewer than `max_connections` are open and fewer than
  `max_connections_per_client` from its address. At `max_connections` an idle connection (no
  request in progress) is closed to make room: the oldest of those that never sent a whole
  request, if idle for MIN_IDLE_S (half-open ones give way to new ones), else the oldest kept alive
  after a response, if idle for MIN_KEPT_IDLE_S; else the new one is refused.

Knows the gateway's config and a clock; nothing of sockets, uvicorn, Prometheus or the routes
(connections.py does the I/O and says what a refusal answers).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from services.common.config import GatewayConfig

# to make room, a connection that never had a request is closed once idle this long, one kept
# alive after a response once idle this long (a client that talks every few seconds keeps it)
MIN_IDLE_S = 0.5
MIN_KEPT_IDLE_S = 2.0
PENDING_S = 10.0  # an accepted connection asyncio never made a protocol for is forgotten after

# why a connection was refused, and why one was closed by the gateway
REFUSED_FULL = "max_connections"
REFUSED_CLIENT = "max_connections_per_client"
REFUSALS = (REFUSED_FULL, REFUSED_CLIENT)
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
IDLE_TIMEOUT = "idle_timeout"
MADE_ROOM = "made_room"
HEADERS_TOO_LARGE = "headers_too_large"
CLOSES = (HEADER_TIMEOUT, BODY_TIMEOUT, IDLE_TIMEOUT, MADE_ROOM, HEADERS_TOO_LARGE)

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 5.0
    max_connections: int = 4096
    max_connections_per_client: int = 512
    retry_after_s: int = 1  # Retry-After of a refusal's 503

    @classmethod
    def from_config(cls, config: GatewayConfig, max_connections: int) -> ConnectionLimits:
        """The config's limits with `max_connections` (the config's, kept under the open files
        limit)."""
        return cls(
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            keepalive_timeout_s=config.keepalive_timeout_s,
            max_connections=max_connections,
            max_connections_per_client=config.max_connections_per_client,
            retry_after_s=max(1, config.retry_after_s),
        )


@dataclass(frozen=True)
class Admission(Generic[C]):
    refused: str | None = None  # REFUSED_FULL or REFUSED_CLIENT; None: admitted
    make_room: C | None = None  # admitted by closing this idle connection


@dataclass
class ConnectionGuard(Generic[C]):
    """Open connections by client address, which of them are idle (no request in progress) and
    since when, and the counts /metrics shows. A connection is admitted under a key that stands
    for it until its protocol `adopt`s it (the accepted socket's descriptor): only adopted
    connections can be closed to make room. One event loop's: not thread-safe."""

    limits: ConnectionLimits
    clock: Callable[[], float] = time.monotonic
    refused: Counter[str] = field(default_factory=Counter)
    closed: Counter[str] = field(default_factory=Counter)
    answered_503: int = 0  # refusals whose request was already there: answered 503
    _hosts: dict[Hashable, str] = field(default_factory=dict)
    _per_client: Counter[str] = field(default_factory=Counter)
    _pending: OrderedDict[Hashable, float] = field(default_factory=OrderedDict)  # not adopted
    # idle connections, oldest first: those that never had a request (half-open), and those
    # kept alive after a response; room is made from the first before the second
    _unused: OrderedDict[C, float] = field(default_factory=OrderedDict)
    _kept: OrderedDict[C, float] = field(default_factory=OrderedDict)

    @property
    def open(self) -> int:
        return len(self._hosts)

    def from_client(self, host: str) -> int:
        return self._per_client[host]

    def admit(self, key: Hashable, host: str) -> Admission[C]:
        """Admits a connection from `host` under `key`, or says why not. At the cap the adopted
        connection idle longest, if idle for MIN_IDLE_S, is released to make room: the caller
        closes it."""
        self._forget_stale()
        self.release(key)  # a descriptor number asyncio closed and the kernel gave out again
        if self._per_client[host] >= self.limits.max_connections_per_client:
            self.refused[REFUSED_CLIENT] += 1
            return Admission(refused=REFUSED_CLIENT)
        room: C | None = None
        if len(self._hosts) >= self.limits.max_connections:
            room = self._longest_idle()
            if room is None:
                self.refused[REFUSED_FULL] += 1
                return Admission(refused=REFUSED_FULL)
            self.release(room)
            self.closed[MADE_ROOM] += 1
        self._hosts[key] = host
        self._per_client[host] += 1
        self._pending[key] = self.clock()
        return Admission(make_room=room)

    def adopt(self, key: Hashable, connection: C) -> bool:
        """`connection` takes the place of the admitted `key`, idle from now; False if `key`
        was not admitted (or was forgotten)."""
        if self._pending.pop(key, None) is None:
            return False
        self._hosts[connection] = self._hosts.pop(key)
        self._unused[connection] = self.clock()
        return True

    def busy(self, connection: C) -> None:
        """A request's headers are in: the connection is no longer a candidate to make room."""
        self._unused.pop(connection, None)
        self._kept.pop(connection, None)

    def idle(self, connection: C) -> None:
        """Its response is complete: kept alive, idle from now."""
        if connection in self._hosts:
            self.busy(connection)
            self._kept[connection] = self.clock()

    def release(self, connection: Hashable) -> None:
        """The connection is closed (or about to be): its slot is free. Idempotent."""
        host = self._hosts.pop(connection, None)
        self._unused.pop(connection, None)  # type: ignore[arg-type]
        self._kept.pop(connection, None)  # type: ignore[arg-type]
        self._pending.pop(connection, None)
        if host is not None:
            self._per_client[host] -= 1
            if self._per_client[host] <= 0:
                del self._per_client[host]

    def _longest_idle(self) -> C | None:
        """The connection to close to make room: the oldest that never had a request, idle for
        MIN_IDLE_S, else the oldest kept alive, idle for MIN_KEPT_IDLE_S; None if neither."""
        for idle, least in ((self._unused, MIN_IDLE_S), (self._kept, MIN_KEPT_IDLE_S)):
            oldest = next(iter(idle.items()), None)
            if oldest is not None and self.clock() - oldest[1] >= least:
                return oldest[0]
        return None

    def _forget_stale(self) -> None:
        """Releases admitted keys never adopted within PENDING_S (asyncio failed to make a
        transport for the connection, and closed it)."""
        while self._pending:
            key, since = next(iter(self._pending.items()))
            if self.clock() - since < PENDING_S:
                return
            self.release(key)
