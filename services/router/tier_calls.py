"""The router's side of the tiers: the small TierClient interface the chat session starts calls
through, its gRPC implementation (one channel per tier), and TierCall, one streaming call.

Knows gRPC and the tier contract; knows nothing of revisions, routing policy or telemetry.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

import grpc
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

CHANNEL_OPTIONS = [("grpc.enable_retries", 0)]


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


class TierCall:
    """One Generate call to one tier, started at construction; read it with chunks()."""

    def __init__(
        self,
        client: TierClient,
        tier: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.tier = tier
        self.request_id = request.request_id
        self.timeout_s = timeout_s
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
        try:
            async for chunk in self.call:
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
