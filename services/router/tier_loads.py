"""Follows each tier's own load report (TierService.WatchLoad) so routing decisions read what
the tiers say, not only this router's in-flight counts; several routers then agree.

One background task per tier keeps the latest snapshot and reconnects after a failure; a tier
that cannot be reached reads as unknown (None). Knows gRPC and the tier contract only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from tiermesh.v1 import tier_pb2

from services.router.policy import TierLoad
from services.router.tier_calls import TierChannels

log = logging.getLogger(__name__)
RETRY_S = 1.0


def load_from_status(status: tier_pb2.TierStatus) -> TierLoad:
    return TierLoad(
        serving=status.serving,
        running=status.running,
        queued=status.queued,
        max_running=status.max_running,
        max_queued=status.max_queued,
        ttft_ms_p50=status.recent_ttft_ms_p50,
        ttft_ms_p99=status.recent_ttft_ms_p99,
        kv_pool_used_tokens=status.kv_pool_used_tokens,
        kv_pool_capacity_tokens=status.kv_pool_capacity_tokens,
    )


class TierLoadWatcher:
    def __init__(self, channels: TierChannels, interval_ms: int) -> None:
        self._channels = channels
        self._interval_ms = interval_ms
        self.loads: dict[str, TierLoad | None] = dict.fromkeys(channels.targets)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for tier in self._channels.targets:
            self._tasks.append(asyncio.create_task(self._watch(tier), name=f"watch-load-{tier}"))

    async def _watch(self, tier: str) -> None:
        request = tier_pb2.WatchLoadRequest(interval_ms=self._interval_ms)
        while True:
            call = self._channels.stub(tier).WatchLoad(request)
            try:
                async for status in call:
                    self.loads[tier] = load_from_status(status)
            except grpc.aio.AioRpcError as e:
                log.debug("load of tier %s unknown: %s", tier, e.code().name)
            finally:
                call.cancel()
            self.loads[tier] = None
            await asyncio.sleep(RETRY_S)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
