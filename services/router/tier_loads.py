"""Follows each tier's own load report (TierService.WatchLoad) and its gRPC health (Health.Watch)
so routing decisions read what the tiers say, not only this router's in-flight counts; several
routers then agree.

Two background tasks per tier keep the latest load snapshot and health and reconnect after a
failure. A tier reads as down (`down()` gives the reason) while its load stream is broken or
silent for longer than `stale_s` (a hung process), or its health says NOT_SERVING (a draining
tier says so at once); its load then reads as unknown (None), which never counts as room.
Knows gRPC and the tier contract only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tiermesh.v1 import tier_pb2

from services.router.policy import TierLoad
from services.router.tier_calls import TierChannels

log = logging.getLogger(__name__)
RETRY_S = 0.25  # pause before reconnecting a broken stream
TIER_SERVICE = tier_pb2.DESCRIPTOR.services_by_name["TierService"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING


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


class LiveLoads(Mapping[str, TierLoad | None]):
    """The loads policies read: a tier's last report while it is up, else None (unknown)."""

    def __init__(self, watcher: TierLoadWatcher) -> None:
        self._watcher = watcher

    def __getitem__(self, tier: str) -> TierLoad | None:
        if self._watcher.down(tier) is not None:
            return None
        return self._watcher.reported[tier]

    def __iter__(self) -> Iterator[str]:
        return iter(self._watcher.reported)

    def __len__(self) -> int:
        return len(self._watcher.reported)


class TierLoadWatcher:
    def __init__(self, channels: TierChannels, interval_ms: int, stale_ms: int = 1000) -> None:
        self._channels = channels
        self._interval_ms = interval_ms
        self._stale_s = stale_ms / 1000
        self.reported: dict[str, TierLoad | None] = dict.fromkeys(channels.targets)
        self._reported_at: dict[str, float] = {}
        self._load_error: dict[str, str | None] = dict.fromkeys(
            channels.targets, "has not reported its load yet"
        )
        self._health: dict[str, str] = {}  # tier -> last health status name
        self._heard: dict[str, asyncio.Event] = {}
        self.loads = LiveLoads(self)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for tier in self._channels.targets:
            self._heard[tier] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._watch(tier), name=f"watch-load-{tier}"))
            self._tasks.append(
                asyncio.create_task(self._watch_health(tier), name=f"watch-health-{tier}")
            )

    async def first_reports(self, timeout_s: float) -> None:
        """Waits until every tier has reported its load or failed once, or `timeout_s`."""
        waits = [event.wait() for event in self._heard.values()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)

    def down(self, tier: str) -> str | None:
        """Why `tier` must not take new calls by its own reports, or None if it may."""
        health = self._health.get(tier)
        if health is not None and health != "SERVING":
            return f"{tier} health {health}"
        error = self._load_error.get(tier)
        if error is not None:
            return f"{tier} {error}"
        age = time.monotonic() - self._reported_at.get(tier, 0.0)
        if age > self._stale_s:
            return f"{tier} silent for {age * 1000:.0f} ms"
        load = self.reported.get(tier)
        if load is not None and not load.serving:
            return f"{tier} not serving"
        return None

    async def _watch(self, tier: str) -> None:
        request = tier_pb2.WatchLoadRequest(interval_ms=self._interval_ms)
        while True:
            call = self._channels.stub(tier).WatchLoad(request)
            try:
                async for status in call:
                    self.reported[tier] = load_from_status(status)
                    self._reported_at[tier] = time.monotonic()
                    self._load_error[tier] = None
                    self._heard[tier].set()
                error = "load stream ended"
            except grpc.aio.AioRpcError as e:
                error = f"load stream broken ({e.code().name})"
                log.debug("load of tier %s unknown: %s", tier, e.code().name)
            finally:
                call.cancel()
            self.reported[tier] = None
            self._load_error[tier] = error
            self._heard[tier].set()
            await asyncio.sleep(RETRY_S)

    async def _watch_health(self, tier: str) -> None:
        request = health_pb2.HealthCheckRequest(service=TIER_SERVICE)
        while True:
            call = health_pb2_grpc.HealthStub(self._channels.channel(tier)).Watch(request)
            try:
                async for response in call:
                    self._health[tier] = health_pb2.HealthCheckResponse.ServingStatus.Name(
                        response.status
                    )
            except grpc.aio.AioRpcError as e:
                log.debug("health of tier %s unknown: %s", tier, e.code().name)
            finally:
                call.cancel()
            self._health.pop(tier, None)  # the load stream's own failure says why
            await asyncio.sleep(RETRY_S)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
