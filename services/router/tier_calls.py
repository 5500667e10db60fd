"""The router's side of the tiers: the small TierClient interface the chat session starts calls
through, its gRPC implementation (one channel per tier), and TierCall, one streaming call.

Knows gRPC and the tier contract; knows nothing of revisions, routing policy or telemetry.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

import grpc
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common import grpc_service

CHANNEL_OPTIONS = [("grpc.enable_retries", 0), *grpc_service.CHANNEL_OPTIONS]


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
    """Starts Generate calls on named tiers: what a chat session needs of the tiers."""

    def generate(
        self,
        tier: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> GenerateStream:
        """Starts the call now; `timeout_s` None means no deadline, else the call ends with
        DEADLINE_EXCEEDED once it passes. `metadata` travels as the call's initial metadata."""
        ...


class TierChannels:
    """A gRPC channel and stub per configured tier (plain host:port or an xds:/// target)."""

    def __init__(self, targets: Mapping[str, str]) -> None:
        self.targets = dict(targets)
        self._channels = {
            tier: grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            for tier, target in targets.items()
        }
        self._stubs = {
            tier: tier_pb2_grpc.TierServiceStub(channel) for tier, channel in self._channels.items()
        }

    def stub(self, tier: str) -> tier_pb2_grpc.TierServiceStub:
        return self._stubs[tier]

    def channel(self, tier: str) -> grpc.aio.Channel:
        return self._channels[tier]

    def generate(
        self,
        tier: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]],
    ) -> GenerateStream:
        call: GenerateStream = self._stubs[tier].Generate(
            request, timeout=timeout_s, metadata=tuple(metadata)
        )
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


class TierCall:
    """One Generate call to one tier, started at construction; read it with chunks(). A call
    with no chunk for `stall_s` (the first included) is cancelled and fails UNAVAILABLE."""

    def __init__(
        self,
        client: TierClient,
        tier: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]] = (),
        stall_s: float | None = None,
    ) -> None:
        self.tier = tier
        self.request_id = request.request_id
        self.timeout_s = timeout_s
        self.stall_s = stall_s
        self.chunk_count = 0
        self.call = client.generate(tier, request, timeout_s, metadata)
        self.text = ""
        self.logprobs: list[float] = []
        self.usage: common_pb2.Usage | None = None
        self.finish_reason = ""
        self.error: grpc.aio.AioRpcError | None = None  # the tier's failure, once read
        self.revision: int | None = None  # the revision it produced, once shown
        self.cancelled = False

    async def chunks(self) -> AsyncIterator[tier_pb2.GenerateChunk]:
        """The tier's chunks; raises grpc.aio.AioRpcError with the tier's status on failure."""
        stream = aiter(self.call)
        try:
            while True:
                try:
                    async with asyncio.timeout(self.stall_s):
                        chunk = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    self.call.cancel()  # a failure, not the router's choice: not `cancelled`
                    assert self.stall_s is not None
                    raise stalled_error(self.tier, self.stall_s, self.chunk_count) from None
                self.chunk_count += 1
                self.text += chunk.text
                self.logprobs.extend(chunk.logprobs)
                if chunk.finish_reason:
                    self.finish_reason = chunk.finish_reason
                    self.usage = chunk.usage
                yield chunk
        except grpc.aio.AioRpcError as e:
            self.error = e
            raise

    @property
    def confidence(self) -> float:
        """Geometric-mean probability of the tokens so far, in [0, 1] (0 when none)."""
        if not self.logprobs:
            return 0.0
        return math.exp(sum(self.logprobs) / len(self.logprobs))

    @property
    def finished(self) -> bool:
        return bool(self.finish_reason)

    def cancel(self) -> None:
        """Cancels the call upstream if it is still running (the tier aborts its work)."""
        if not self.call.done():
            self.cancelled = True
            self.call.cancel()
