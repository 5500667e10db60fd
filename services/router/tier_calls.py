"""The router's side of the tiers: one channel per tier, and one streaming call per revision.

Knows gRPC and the tier contract; knows nothing of revisions or routing policy.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping

import grpc
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.router.chat_telemetry import TierCallSpan

CHANNEL_OPTIONS = [("grpc.enable_retries", 0)]


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

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


class TierCall:
    """One Generate call to one tier, started at construction; read it with chunks()."""

    def __init__(
        self,
        channels: TierChannels,
        tier: str,
        request: tier_pb2.GenerateRequest,
        timeout_s: float | None,
        span: TierCallSpan | None = None,
    ) -> None:
        self.tier = tier
        self.timeout_s = timeout_s
        self._span = span
        metadata = span.metadata if span is not None else None
        self.call = channels.stub(tier).Generate(request, timeout=timeout_s, metadata=metadata)
        self.text = ""
        self.logprobs: list[float] = []
        self.usage: common_pb2.Usage | None = None
        self.finish_reason = ""
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
            self._end_span(e.code().name, e.details() or "")
            raise
        self._end_span("OK")

    def _end_span(self, code: str, message: str = "") -> None:
        if self._span is not None:
            self._span.end(code, message, self.usage)

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
        if not self.finished:
            self._end_span("CANCELLED", "cancelled by the router")
