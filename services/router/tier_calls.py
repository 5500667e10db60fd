"""The router's side of the tiers: the small TierClient interface the chat session starts calls
through, its gRPC implementation (one channel per replica of each tier), and TierCall, one
streaming call.

Knows gRPC and the tier contract; knows nothing of revisions, routing policy or telemetry.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Protocol

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common import grpc_service

# A restarted replica is found again within 250 ms: a failed call moves on to the tier's other
# replicas, so a channel still waiting out a longer reconnect backoff (the shared 1 s) turns a
# replica that is back into "failed to connect" for a continuation sent to it. A connection
# attempt to a dead replica four times a second costs little.
TIER_RECONNECT_BACKOFF_MS = 250
CHANNEL_OPTIONS = [
    *(
        option
        for option in grpc_service.CHANNEL_OPTIONS
        if option[0] != "grpc.max_reconnect_backoff_ms"
    ),
    ("grpc.max_reconnect_backoff_ms", TIER_RECONNECT_BACKOFF_MS),
]
# gRPC's own retries (gRFC A6) of a tier call on the same target: they happen only before the
# tier's first response (its headers or first chunk), so a retried call never repeats a token.
# With an xds:/// target the mesh's route sets the policy (the topology's `retry`); with plain
# addresses this default does: one retry of UNAVAILABLE after 0-25 ms (the topology's default).
# The router's own failover (chat_session) then moves a call that still fails to another
# replica or tier; it never calls the same target again, so no layer repeats the other's work.
PLAIN_RETRY_POLICY = {
    "maxAttempts": 2,
    "initialBackoff": "0.025s",
    "maxBackoff": "0.25s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
PLAIN_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {"name": [{"service": "tiermesh.v1.TierService"}], "retryPolicy": PLAIN_RETRY_POLICY}
        ]
    }
)


class GenerateStream(Protocol):
    """A running Generate call (a grpc.aio.UnaryStreamCall satisfies it). Iterating it yields
    the tier's chunks and raises grpc.aio.AioRpcError with the tier's status on failure; the
    call runs upstream from the moment it is made, read or not. Not thread-safe: one event loop.
    """

    def __aiter__(self) -> AsyncIterator[tier_pb2.GenerateChunk]: ...

    def done(self) -> bool:
        """True once the call has ended upstream (finished, failed, cancelled or timed out)."""
        ...

    def cancel(self) -> bool:
        """Cancels the call upstream (the tier aborts its work); False if it had already ended."""
        ...


class TierClient(Protocol):
    """Starts Generate calls on the tiers' replicas: what a chat session needs of the tiers."""

    def endpoints(self, tier: str) -> tuple[str, ...]:
        """The tier's replicas (their gRPC targets), in configured order; at least one."""
        ...

    def pick(self, tier: str, avoid: Collection[str]) -> str | None:
        """The replica of `tier` a new call goes to, none of `avoid` (replicas already tried):
        one able to take it, least loaded first; None when every replica is in `avoid`."""
        ...

    def generate(
        self,
        tier: str,
        endpoint: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> GenerateStream:
        """Starts the call on `endpoint` (a replica of `tier`) now; `timeout_s` None means no
        deadline, else the call ends with DEADLINE_EXCEEDED once it passes. `metadata` travels
        as the call's initial metadata."""
        ...


Picker = Callable[[str, Sequence[str]], str]  # (tier, candidate replicas) -> the one to use


def split_targets(target: str) -> tuple[str, ...]:
    """A tier's replicas from its configured target: "host:port", several separated by commas,
    or one xds:/// target (the xDS client balances over its endpoints)."""
    return tuple(part.strip() for part in target.split(",") if part.strip())


def channel_options(target: str) -> list[tuple[str, int | str]]:
    """A tier channel's options: keepalive, and the plain-address retry policy unless the mesh
    gives the policy (an xds:/// target)."""
    if target.startswith("xds:"):
        return list(CHANNEL_OPTIONS)
    return [*CHANNEL_OPTIONS, ("grpc.service_config", PLAIN_SERVICE_CONFIG)]


def _channel(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=channel_options(target))
    return grpc.aio.secure_channel(target, credentials, options=channel_options(target))


class TierChannels:
    """A gRPC channel and stub per replica of each configured tier (plain host:port or an
    xds:/// target). Which replica a call goes to is the `picker`'s choice (the router's tier
    health); without one, the first not yet tried."""

    def __init__(
        self, targets: Mapping[str, str], credentials: grpc.ChannelCredentials | None = None
    ) -> None:
        """`credentials` make every channel TLS (mTLS with the router's certificate)."""
        self.targets = dict(targets)
        self.replicas = {tier: split_targets(target) for tier, target in targets.items()}
        self._channels = {
            endpoint: _channel(endpoint, credentials)
            for endpoints in self.replicas.values()
            for endpoint in endpoints
        }
        self._stubs = {
            endpoint: tier_pb2_grpc.TierServiceStub(channel)
            for endpoint, channel in self._channels.items()
        }
        self.picker: Picker | None = None
        self.on_call: Callable[[str, grpc.aio.Call], None] | None = None  # each call started

    def endpoints(self, tier: str) -> tuple[str, ...]:
        return self.replicas[tier]

    def stub(self, endpoint: str) -> tier_pb2_grpc.TierServiceStub:
        return self._stubs[endpoint]

    def channel(self, endpoint: str) -> grpc.aio.Channel:
        return self._channels[endpoint]

    def pick(self, tier: str, avoid: Collection[str]) -> str | None:
        left = [endpoint for endpoint in self.replicas[tier] if endpoint not in avoid]
        if not left:
            return None
        return self.picker(tier, left) if self.picker is not None else left[0]

    def generate(
        self,
        tier: str,
        endpoint: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> GenerateStream:
        call: GenerateStream = self._stubs[endpoint].Generate(
            request, timeout=timeout_s, metadata=tuple(metadata)
        )
        if self.on_call is not None:
            self.on_call(endpoint, call)
        return call

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


def stalled_error(tier: str, stall_s: float, chunks: int) -> grpc.aio.AioRpcError:
    """The failure a call that went silent ends with: UNAVAILABLE, naming the stall."""
    what = "first chunk" if chunks == 0 else f"chunk after {chunks}"
    details = f"stalled: no {what} from tier {tier} within {stall_s * 1000:.0f} ms"
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details
    )


class StallWatch:
    """Cancels a call that has been waited on for its next chunk for `stall_s`. One timer per
    call, re-armed only when it fires, so reading a chunk costs two attribute writes; time the
    reader spends elsewhere (its consumer is slow, or it has not started reading) never counts.

    `queued()`, when given, says whether the call may be waiting in its replica's queue (the
    replica reports, fresh, requests waiting): a call with no chunk yet that is found queued
    when its time is up starts its `stall_s` again (its tier's admission bounds the wait and
    refuses past it), so it has all of `stall_s` for its first chunk once it leaves the queue. A
    replica that hangs stops reporting and reads as down within the router's load_stale_ms: its
    silent calls then fail as stalled within `stall_s` more.
    """

    def __init__(
        self, call: GenerateStream, stall_s: float, queued: Callable[[], bool] | None = None
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._call = call
        self._stall_s = stall_s
        self._queued = queued
        self.waiting_since: float | None = None  # the reader awaits a chunk since then
        self.first = True  # no chunk has come yet
        self.fired = False  # the call was cancelled as stalled
        self._timer = self._loop.call_later(stall_s, self._check)

    def _check(self) -> None:
        since, now = self.waiting_since, self._loop.time()
        if since is not None and now - since >= self._stall_s:
            if not (self.first and self._queued is not None and self._queued()):
                self.fired = True
                self._call.cancel()  # a failure, not the router's choice: TierCall.cancelled stays
                return
            self.waiting_since = since = now  # queued, not stalled: its time starts again
        left = self._stall_s if since is None else self._stall_s - (now - since)
        self._timer = self._loop.call_later(left, self._check)

    def stop(self) -> None:
        self._timer.cancel()


class TierCall:
    """One Generate call to one replica of a tier, started at construction; read it with
    chunks(). A call with no chunk for `stall_s` (the first included, unless `queued()` says it
    may wait in its replica's queue: StallWatch) is cancelled and fails UNAVAILABLE. What its
    chunks carry is the chat session core's to keep (session_calls.py)."""

    def __init__(
        self,
        client: TierClient,
        tier: str,
        endpoint: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]] = (),
        stall_s: float | None = None,
        queued: Callable[[], bool] | None = None,
    ) -> None:
        self.tier = tier
        self.endpoint = endpoint
        self.stall_s = stall_s
        self._queued = queued
        self.chunk_count = 0
        self.call = client.generate(tier, endpoint, request, timeout_s, metadata)

    async def chunks(self) -> AsyncIterator[tier_pb2.GenerateChunk]:
        """The tier's chunks; raises grpc.aio.AioRpcError with the tier's status on failure."""
        loop = asyncio.get_running_loop()
        watch = None
        if self.stall_s is not None:
            watch = StallWatch(self.call, self.stall_s, self._queued)
        try:
            if watch is not None:
                watch.waiting_since = loop.time()
            async for chunk in self.call:
                if watch is not None:
                    watch.waiting_since, watch.first = None, False
                self.chunk_count += 1
                yield chunk
                if watch is not None:
                    watch.waiting_since = loop.time()
        except grpc.aio.AioRpcError as e:
            if watch is not None and watch.fired:
                raise self._stalled() from None
            raise e
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if watch is None or not watch.fired or (task is not None and task.cancelling()):
                raise  # the router's own cancel, not the stall watch's
            raise self._stalled() from None
        finally:
            if watch is not None:
                watch.stop()

    def _stalled(self) -> grpc.aio.AioRpcError:
        assert self.stall_s is not None
        return stalled_error(self.tier, self.stall_s, self.chunk_count)

    def cancel(self) -> None:
        """Cancels the call upstream if it is still running (the tier aborts its work)."""
        if not self.call.done():
            self.call.cancel()
