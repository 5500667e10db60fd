"""Whether a gRPC server's health service says SERVING: asked once (`health_status`,
`is_serving`, over `open_channel`, the blocking channel the launcher and CLI use), or polled
until it does (`wait_serving`, and `wait_serving_async` for an event
loop), with a deadline and an error that names the target and what it last answered. Knows the
standard grpc.health.v1 protocol only; nothing of what the server serves or how it was started
(a caller that started it hands in how to tell that it exited).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = "SERVING"
CHECK_TIMEOUT_S = 0.5  # one Check call; a server that is up answers in milliseconds

Exited = Callable[[], int | None]  # the exit code of the process behind the target, or None


class NotServingError(Exception):
    """The target did not say SERVING in time, or its process exited first; the message names
    the target and what its health last answered."""

    def __init__(self, target: str, seen: str, exit_code: int | None, timeout_s: float) -> None:
        why = (
            f"not SERVING within {timeout_s:g} s"
            if exit_code is None
            else f"exited with code {exit_code} before it was SERVING"
        )
        super().__init__(f"{target}: {why} (health last answered: {seen})")
        self.target = target
        self.seen = seen
        self.exit_code = exit_code


def open_channel(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A blocking channel to `target`: mTLS with `credentials`, else plaintext."""
    if credentials is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, credentials)


def health_status(
    target: str,
    credentials: grpc.ChannelCredentials | None = None,
    timeout_s: float = CHECK_TIMEOUT_S,
    service: str = "",
) -> str:
    """What the health service of the server at `target` answers for `service` ("" = the whole
    server): SERVING, NOT_SERVING, ... or, when the call fails, its code and details
    ("UNAVAILABLE: failed to connect ..."). A fresh channel each time, so a server that just
    came up is seen at once (a kept channel would wait out its reconnect backoff)."""
    with open_channel(target, credentials) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as e:
            return f"{e.code().name}: {e.details()}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def is_serving(target: str, credentials: grpc.ChannelCredentials | None = None) -> bool:
    """True when the server at `target` answers gRPC health with SERVING."""
    return health_status(target, credentials) == SERVING


@dataclass
class _Wait:
    """One wait's deadline and what it has seen so far."""

    label: str
    timeout_s: float
    exited: Exited | None
    deadline: float = 0.0
    seen: str = "nothing yet"

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s

    def done(self, seen: str) -> bool:
        """True on SERVING; raises NotServingError if the process exited or time is up."""
        self.seen = seen
        if seen == SERVING:
            return True
        code = self.exited() if self.exited is not None else None
        if code is not None or time.monotonic() >= self.deadline:
            raise NotServingError(self.label, seen, code, self.timeout_s)
        return False


def _label(target: str, name: str | None) -> str:
    return target if name is None else f"{name} ({target})"


def wait_serving(
    target: str,
    timeout_s: float,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    exited: Exited | None = None,
    interval_s: float = 0.2,
    name: str | None = None,
) -> None:
    """Polls the health of `target` every `interval_s` until it says SERVING. Raises
    NotServingError after `timeout_s`, or as soon as `exited()` (called after each answer that
    is not SERVING) returns an exit code. `name` is how the error names the target."""
    wait = _Wait(_label(target, name), timeout_s, exited)
    while not wait.done(health_status(target, credentials)):
        time.sleep(interval_s)


async def wait_serving_async(
    target: str,
    timeout_s: float,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    exited: Exited | None = None,
    interval_s: float = 0.1,
    name: str | None = None,
) -> None:
    """`wait_serving` for an event loop: each check runs in a worker thread, so the loop goes on
    while a server is slow to answer, and cancelling the wait stops it between checks."""
    wait = _Wait(_label(target, name), timeout_s, exited)
    while not wait.done(await asyncio.to_thread(health_status, target, credentials)):
        await asyncio.sleep(interval_s)
