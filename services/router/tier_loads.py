"""Follows each tier replica's own load report (TierService.WatchLoad) and its gRPC health
(Health.Watch) so routing decisions read what the tiers say, not only this router's in-flight
counts; several routers then agree.

Two background tasks per replica keep the latest load snapshot and health and reconnect after a
failure. A replica reads as down (`endpoint_down()` gives the reason) while its load stream is
broken or silent for longer than `stale_s` (a hung process), or its health says NOT_SERVING (a
draining tier says so at once, and the router then leaves both its streams so that they do not
hold the drain open); its load then reads as unknown (None), which never counts as room. A
tier's load, for the policies, is that of its least loaded replica that is up. Between two
reports a replica's load is its last report moved on by the calls this router has started and
seen end there since (`track_call`), never below the report: a burst that fills a replica
between reports reads as filling it, not as the room it had at the report. A replica that
refused a call for overload (`note_refusal`) reads as full (`TierLoad.refusing`) until its next
load report: until then the router refuses at once itself (or falls back) instead of sending it
calls it would refuse; at most one call per replica and report interval learns afresh. Knows
gRPC and the tier contract only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

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
        expected_wait_ms=status.expected_wait_ms,
        max_wait_ms=status.max_wait_ms,
        queued_batch=min(status.queued_batch, status.queued),
    )


class LiveLoads(Mapping[str, TierLoad | None]):
    """The loads policies read: per tier, its least loaded replica that is up, else None."""

    def __init__(self, watcher: TierLoadWatcher) -> None:
        self._watcher = watcher

    def __getitem__(self, tier: str) -> TierLoad | None:
        loads = [self._watcher.endpoint_load(e) for e in self._watcher.replicas[tier]]
        known = [load for load in loads if load is not None]
        return min(known, key=lambda load: (load.queue_full, load.fill), default=None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._watcher.replicas)

    def __len__(self) -> int:
        return len(self._watcher.replicas)


class TierLoadWatcher:
    def __init__(
        self,
        channels: TierChannels,
        interval_ms: int,
        stale_ms: int = 1000,
        starting_s: float = 60.0,
    ) -> None:
        """`starting_s`: for so long after the watcher starts, a replica that has never served
        counts as starting (loading), not down: tiers launched with the router come up late."""
        self._channels = channels
        self._started_at = time.monotonic()
        self._starting_s = starting_s
        self._served: set[str] = set()  # replicas that have served since the watcher started
        self._interval_ms = interval_ms
        self._stale_s = stale_ms / 1000
        self.replicas = dict(channels.replicas)
        endpoints = list(dict.fromkeys(e for es in self.replicas.values() for e in es))
        self.reported: dict[str, TierLoad | None] = dict.fromkeys(endpoints)
        self._reported_at: dict[str, float] = {}
        self._load_error: dict[str, str | None] = dict.fromkeys(
            endpoints, "has not reported its load yet"
        )
        self._refused: dict[str, TierLoad] = {}  # endpoint -> the report it refused under
        self._refused_batch: dict[str, TierLoad] = {}  # ... a batch call, the others not yet
        # calls this router started on the replica since its last report, less those ended
        self._calls_since_report: dict[str, int] = dict.fromkeys(endpoints, 0)
        self._health: dict[str, str] = {}  # endpoint -> last health status name
        self._draining: set[str] = set()  # went NOT_SERVING after SERVING; cleared when back
        self._load_calls: dict[str, grpc.aio.UnaryStreamCall[Any, Any]] = {}
        self._heard: dict[str, asyncio.Event] = {}
        self._change = asyncio.Event()  # set (and replaced) when a replica starts or stops serving
        self.loads = LiveLoads(self)
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for endpoint in self.reported:
            self._heard[endpoint] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._watch(endpoint), name=f"load-{endpoint}"))
            self._tasks.append(
                asyncio.create_task(self._watch_health(endpoint), name=f"health-{endpoint}")
            )

    async def first_reports(self, timeout_s: float) -> None:
        """Waits until every replica has reported its load or failed once, or `timeout_s`."""
        waits = [event.wait() for event in self._heard.values()]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)

    def endpoint_down(self, endpoint: str) -> str | None:
        """Why the replica must not take new calls by its own reports, or None if it may."""
        if endpoint in self._draining:
            return "health NOT_SERVING (draining)"
        health = self._health.get(endpoint)
        if health is not None and health != "SERVING":
            return f"health {health}"
        error = self._load_error.get(endpoint)
        if error is not None:
            return error
        age = time.monotonic() - self._reported_at.get(endpoint, 0.0)
        if age > self._stale_s:
            return f"silent for {age * 1000:.0f} ms"
        load = self.reported.get(endpoint)
        if load is not None and not load.serving:
            return "not serving"
        return None

    def endpoint_loading(self, endpoint: str) -> bool:
        """Whether the replica will serve soon: up but not serving yet (loading its model), or
        not answering yet while it has never served and the router is young (a tier process
        still starting). Never one that drains."""
        if endpoint in self._draining:
            return False
        young = time.monotonic() - self._started_at < self._starting_s
        if endpoint not in self._served and young:
            return True
        health = self._health.get(endpoint)
        load = self.reported.get(endpoint)
        return (health is not None and health != "SERVING") or (
            load is not None and not load.serving
        )

    async def changed(self, timeout_s: float) -> None:
        """Returns when a replica starts or stops serving, or after `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._change.wait(), timeout_s)

    def _pulse(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    def endpoint_load(self, endpoint: str) -> TierLoad | None:
        """The replica's last load report while it is up, else None (unknown); `refusing` set
        while it reads as full after a refusal."""
        if self.endpoint_down(endpoint) is not None:
            return None
        load = self.reported[endpoint]
        if load is None:
            return None
        refusing = self._refused.get(endpoint) is load
        refusing_batch = self._refused_batch.get(endpoint) is load
        # never below the report: a call started just before it may not have reached the tier
        # by then, and it would be counted out when it ends without ever having been counted in
        change = self._calls_since_report.get(endpoint, 0)
        if change > 0:
            load = load.after_calls(change)
        if refusing or refusing_batch:
            load = replace(load, refusing=refusing, refusing_batch=refusing_batch)
        return load

    def track_call(self, endpoint: str, call: grpc.aio.Call) -> None:
        """A call to the replica started now: it counts toward the replica's load until it ends
        or the replica's next report (which counts it itself)."""
        if endpoint not in self._calls_since_report:
            return
        self._calls_since_report[endpoint] += 1
        call.add_done_callback(lambda _: self._call_ended(endpoint))

    def _call_ended(self, endpoint: str) -> None:
        self._calls_since_report[endpoint] -= 1

    def note_refusal(self, endpoint: str, batch_only: bool = False) -> None:
        """A call to the replica was refused for overload: it reads as full until its next
        load report; for batch chats only when the refused call was a batch one (the tier's
        queue takes the others before batch)."""
        load = self.reported.get(endpoint)
        if load is not None:
            (self._refused_batch if batch_only else self._refused)[endpoint] = load

    async def _watch(self, endpoint: str) -> None:
        request = tier_pb2.WatchLoadRequest(interval_ms=self._interval_ms)
        while True:
            call = self._channels.stub(endpoint).WatchLoad(request)
            self._load_calls[endpoint] = call
            try:
                async for status in call:
                    before = self.reported[endpoint]
                    self.reported[endpoint] = load_from_status(status)
                    if status.serving:
                        self._served.add(endpoint)
                    if before is None or before.serving != status.serving:
                        self._pulse()
                    self._calls_since_report[endpoint] = 0
                    self._refused.pop(endpoint, None)
                    self._refused_batch.pop(endpoint, None)
                    self._reported_at[endpoint] = time.monotonic()
                    self._load_error[endpoint] = None
                    self._heard[endpoint].set()
                error = "load stream ended"
            except grpc.aio.AioRpcError as e:
                error = f"load stream broken ({e.code().name})"
                log.debug("load of %s unknown: %s", endpoint, e.code().name)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the watcher stops
                error = "load stream left (the tier drains)"  # cancelled by _watch_health
            finally:
                call.cancel()
                self._load_calls.pop(endpoint, None)
            self.reported[endpoint] = None
            self._load_error[endpoint] = error
            self._heard[endpoint].set()
            await asyncio.sleep(RETRY_S)

    async def _watch_health(self, endpoint: str) -> None:
        """Follows the replica's health. When it turns NOT_SERVING after SERVING (it drains),
        both its streams are left, so that they do not hold its drain open, and it stays down
        until a new health stream says otherwise."""
        request = health_pb2.HealthCheckRequest(service=TIER_SERVICE)
        while True:
            call = health_pb2_grpc.HealthStub(self._channels.channel(endpoint)).Watch(request)
            serving = False
            try:
                async for response in call:
                    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                    if self._health.get(endpoint) != status:
                        self._pulse()
                    if status == "SERVING":
                        self._served.add(endpoint)
                    self._health[endpoint] = status
                    self._draining.discard(endpoint)
                    if status == "SERVING":
                        serving = True
                    elif serving:
                        self._draining.add(endpoint)
                        log.info("tier replica %s drains: routing leaves it", endpoint)
                        break
            except grpc.aio.AioRpcError as e:
                log.debug("health of %s unknown: %s", endpoint, e.code().name)
            finally:
                call.cancel()
            if endpoint in self._draining and (load := self._load_calls.get(endpoint)):
                load.cancel()
            self._health.pop(endpoint, None)  # the load stream's own failure says why
            await asyncio.sleep(RETRY_S)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
