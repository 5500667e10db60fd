"""Watches the mesh's services while a benchmark runs: CPU time and memory of their processes
(read from /proc/<pid>/stat and /proc/<pid>/status, Linux only; psutil is not used) and each
tier's load and KV-cache pool (its GetStatus RPC), sampled in the background.

Knows process ids, addresses and the tier contract; nothing of prices, load or reports. Without
a pid (a mesh the bench did not start and was not told about) CPU and RSS are unknown (None).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads) since it started."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command name: state is field 3, utime 14 and stime 15 (1-based, man proc)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_memory(pid: int) -> dict[str, int]:
    """{"rss": bytes resident now, "hwm": peak resident bytes since start} ({} if unreadable)."""
    wanted = {"VmRSS": "rss", "VmHWM": "hwm"}
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in wanted:
                    found[wanted[key]] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return {}
    return found


@dataclass(frozen=True)
class ServiceHandle:
    """A service of the mesh: its name ("small", ..., "router"), where it listens, its pid."""

    name: str
    address: str | None = None
    pid: int | None = None
    is_tier: bool = True


@dataclass
class ServicePeaks:
    """What the monitor saw of one service since the last reset."""

    rss_peak_bytes: int | None = None
    kv_used_peak_tokens: int | None = None
    running_peak: int | None = None
    queued_peak: int | None = None
    status: tier_pb2.TierStatus | None = None  # the last GetStatus answer

    def to_json(self, pid: int | None) -> dict[str, Any]:
        status = self.status
        row: dict[str, Any] = {
            "rss_peak_bytes": self.rss_peak_bytes,
            "rss_hwm_bytes": process_memory(pid).get("hwm") if pid else None,
            "kv_used_peak_tokens": self.kv_used_peak_tokens,
            "running_peak": self.running_peak,
            "queued_peak": self.queued_peak,
        }
        if status is not None:
            capacity = status.kv_pool_capacity_tokens
            row.update(
                model=status.model,
                params=status.params,
                weights_bytes=status.weights_bytes,
                kv_pool_bytes=status.kv_pool_bytes,
                kv_pool_capacity_tokens=capacity,
                kv_pool_peak_tokens=status.kv_pool_peak_tokens,  # since the tier started
                kv_used_peak_bytes=None
                if not capacity or self.kv_used_peak_tokens is None
                else self.kv_used_peak_tokens * status.kv_pool_bytes // capacity,
            )
        return row


def _max(current: int | None, value: int) -> int:
    return value if current is None else max(current, value)


@dataclass
class ResourceMonitor:
    """Samples every service each `interval_s` until closed. Use `reset()` at the start of a
    configuration and read `peaks` and `cpu_seconds()` at its end."""

    services: list[ServiceHandle]
    interval_s: float = 0.5
    peaks: dict[str, ServicePeaks] = field(default_factory=dict)
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for service in self.services:
            if service.is_tier and service.address:
                self._channels[service.name] = grpc.aio.insecure_channel(service.address)
        self.reset()
        await self.sample()
        self._task = asyncio.create_task(self._poll())

    def reset(self) -> None:
        self.peaks = {service.name: ServicePeaks() for service in self.services}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds since start of every service whose process can be read."""
        seconds = {}
        for service in self.services:
            value = process_cpu_seconds(service.pid) if service.pid else None
            if value is not None:
                seconds[service.name] = value
        return seconds

    async def status(self, name: str) -> tier_pb2.TierStatus | None:
        channel = self._channels.get(name)
        if channel is None:
            return None
        try:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            status: tier_pb2.TierStatus = await stub.GetStatus(
                tier_pb2.GetStatusRequest(), timeout=2.0
            )
            return status
        except grpc.aio.AioRpcError:
            return None

    async def sample(self) -> None:
        statuses = await asyncio.gather(*(self.status(s.name) for s in self.services))
        for service, status in zip(self.services, statuses, strict=True):
            peaks = self.peaks.setdefault(service.name, ServicePeaks())
            if service.pid:
                rss = process_memory(service.pid).get("rss")
                if rss is not None:
                    peaks.rss_peak_bytes = _max(peaks.rss_peak_bytes, rss)
            if status is not None:
                peaks.status = status
                peaks.kv_used_peak_tokens = _max(
                    peaks.kv_used_peak_tokens, status.kv_pool_used_tokens
                )
                peaks.running_peak = _max(peaks.running_peak, status.running)
                peaks.queued_peak = _max(peaks.queued_peak, status.queued)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.sample()

    async def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Waits until no tier runs or queues a request; False if time ran out."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            statuses = [await self.status(name) for name in self._channels]
            if all(s is None or (s.running == 0 and s.queued == 0) for s in statuses):
                return True
            await asyncio.sleep(0.1)
        return False

    def memory_json(self) -> dict[str, dict[str, Any]]:
        return {
            s.name: self.peaks.get(s.name, ServicePeaks()).to_json(s.pid) for s in self.services
        }

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
