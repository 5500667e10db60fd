"""`tiermesh bench sweep --cost-curve`: what the router costs as load grows. At each concurrency
level, closed-loop streams go straight to one tier (the baseline), then through one router
pinned to that tier, then through all the routers at once (the clients split over their
addresses, as a plain list of targets). Per run: chats/s, time to first token p50/p99 and the
router's first-token overhead over the direct run of the same level, the routers' CPU seconds
per 1,000 chats (/proc/<pid>/stat), their RSS, and errors by status.

The client is lean on purpose (raw stubs, no SDK events) and opens one channel per
STREAMS_PER_CHANNEL streams, each its own connection, so no connection carries more streams
than a server's per-connection limit would let through at once. Knows the tier and router wire
contracts and process ids; nothing of answer quality or prices.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from tiermesh.v1 import router_pb2, router_pb2_grpc, tier_pb2, tier_pb2_grpc

from services.bench.metrics import percentile
from services.bench.resources import process_cpu_seconds, process_memory

STREAMS_PER_CHANNEL = 100
FAILURE_BACKOFF_S = 0.5  # a client waits this long after a failed chat, as a polite client
# told RESOURCE_EXHAUSTED would: 1,000 refused clients must not become a busy loop
PAUSE_S = 0.5  # between runs: cancelled streams of the last run settle
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel

# (chat index, its sample): runs the chat, filling in the sample's ttft_s as soon as the first
# token arrives and its status at the end
StreamCall = Callable[[int, "Sample"], Awaitable[None]]


@dataclass(frozen=True)
class Process:
    name: str  # "small", "router", "router-2"
    address: str
    pid: int | None


@dataclass
class CostMesh:
    """What the cost curve drives: the tier every chat is pinned to, and the routers."""

    tier: str
    tier_process: Process
    routers: list[Process]


@dataclass(frozen=True)
class CostOptions:
    levels: Sequence[int]
    duration_s: float = 10.0
    warmup_s: float = 2.0
    max_tokens: int = 64
    timeout_s: float = 60.0
    prompts: Sequence[str] = ("Where is my order?",)
    # the clients' first chats are spread evenly over this many seconds (None: the warm-up),
    # so N clients do not start, and then keep arriving, as one burst of N chats
    ramp_s: float | None = None

    @property
    def ramp(self) -> float:
        return self.warmup_s if self.ramp_s is None else self.ramp_s


@dataclass
class Sample:
    """One chat: when it started and ended (seconds since the run started; ended_s None while
    it runs), its time to first token (seconds) and its status name."""

    started_s: float
    ended_s: float | None = None
    ttft_s: float | None = None
    status: str = "RUNNING"


@dataclass
class Window:
    """CPU seconds (per watched process, and this client's own) and RSS over a run's window."""

    cpu_start: dict[str, float] = field(default_factory=dict)
    cpu_end: dict[str, float] = field(default_factory=dict)
    client_start: float = 0.0
    client_end: float = 0.0
    rss: dict[str, int] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        return {
            k: round(self.cpu_end[k] - v, 3) for k, v in self.cpu_start.items() if k in self.cpu_end
        }


def open_channels(addresses: Sequence[str], clients: int) -> list[grpc.aio.Channel]:
    """Enough channels for `clients` streams over the addresses, interleaved by address."""
    per_address = max(1, math.ceil(clients / len(addresses) / STREAMS_PER_CHANNEL))
    return [
        grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        for _ in range(per_address)
        for address in addresses
    ]


def tier_calls(channels: Sequence[grpc.aio.Channel], run: str, options: CostOptions) -> StreamCall:
    """Chats straight to a tier, as the router would send them (one user message)."""
    stubs = [tier_pb2_grpc.TierServiceStub(channel) for channel in channels]

    async def call(index: int, sample: Sample) -> None:
        prompt = options.prompts[index % len(options.prompts)]
        request = tier_pb2.GenerateRequest(
            request_id=f"cost-{run}-{index}",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=options.max_tokens,
        )
        sent = time.perf_counter()
        try:
            async for chunk in stubs[index % len(stubs)].Generate(
                request, timeout=options.timeout_s
            ):
                if sample.ttft_s is None and chunk.token_ids:
                    sample.ttft_s = time.perf_counter() - sent
        except grpc.aio.AioRpcError as e:
            sample.status = e.code().name
            return
        sample.status = "OK"

    return call


def router_calls(
    channels: Sequence[grpc.aio.Channel], run: str, tier: str, options: CostOptions
) -> StreamCall:
    """Chats through the router(s), pinned to `tier`; OK only when Final arrives."""
    stubs = [router_pb2_grpc.RouterServiceStub(channel) for channel in channels]

    async def call(index: int, sample: Sample) -> None:
        request = router_pb2.ChatRequest(
            request_id=f"cost-{run}-{index}",
            prompt=options.prompts[index % len(options.prompts)],
            mode=router_pb2.MODE_PINNED,
            tier=tier,
            max_tokens=options.max_tokens,
        )
        sent, final = time.perf_counter(), False
        try:
            async for event in stubs[index % len(stubs)].Chat(request, timeout=options.timeout_s):
                kind = event.WhichOneof("event")
                if sample.ttft_s is None and kind == "delta" and event.delta.text:
                    sample.ttft_s = time.perf_counter() - sent
                final = final or kind == "final"
        except grpc.aio.AioRpcError as e:
            sample.status = e.code().name
            return
        sample.status = "OK" if final else "NO_FINAL"

    return call


async def closed_loop(
    call: StreamCall, clients: int, options: CostOptions, watched: Sequence[Process]
) -> tuple[list[Sample], Window]:
    """`clients` clients, each starting its next chat when the last ends, for duration_s; client
    i starts its first chat at i / clients of the ramp. Chats still running at the end are
    cancelled (their samples keep ended_s None, and their first token if it came). CPU is read
    at warmup_s and at the end, RSS at the end."""
    start = time.perf_counter()
    counter = itertools.count()
    samples: list[Sample] = []
    window = Window()

    def now() -> float:
        return time.perf_counter() - start

    def cpu() -> dict[str, float]:
        values = {p.name: process_cpu_seconds(p.pid) if p.pid else None for p in watched}
        return {name: value for name, value in values.items() if value is not None}

    async def client(number: int) -> None:
        await asyncio.sleep(options.ramp * number / clients)
        while (started := now()) < options.duration_s:
            sample = Sample(started)
            samples.append(sample)
            await call(next(counter), sample)
            sample.ended_s = now()
            if sample.status != "OK":
                await asyncio.sleep(FAILURE_BACKOFF_S)

    async def mark_start() -> None:
        await asyncio.sleep(options.warmup_s)
        window.cpu_start, window.client_start = cpu(), time.process_time()

    marker = asyncio.create_task(mark_start())
    tasks = [asyncio.create_task(client(number)) for number in range(clients)]
    await asyncio.wait(tasks, timeout=options.duration_s)
    window.cpu_end, window.client_end = cpu(), time.process_time()
    for p in watched:
        if p.pid and (rss := process_memory(p.pid).get("rss")) is not None:
            window.rss[p.name] = rss
    for task in [*tasks, marker]:
        task.cancel()
    await asyncio.gather(*tasks, marker, return_exceptions=True)
    return samples, window


def summarise(
    samples: Sequence[Sample], window: Window, options: CostOptions, routers: Sequence[Process]
) -> dict[str, Any]:
    """One run's numbers over its measured window: chats/s and errors of the chats that ended
    in it, TTFT of the chats that started in it and had their first token before its end."""
    start, end = options.warmup_s, options.duration_s
    span = end - start
    ended = [s for s in samples if s.ended_s is not None and start <= s.ended_s <= end]
    ok = [s for s in ended if s.status == "OK"]
    ttfts = [
        s.ttft_s * 1000
        for s in samples
        if s.ttft_s is not None and s.started_s >= start and s.started_s + s.ttft_s <= end
    ]
    cpu = window.cpu()
    router_cpu = sum(cpu.get(r.name, 0.0) for r in routers) if routers else None
    p50, p99 = percentile(ttfts, 0.5), percentile(ttfts, 0.99)
    return {
        "chats": len(ok),
        "chats_per_s": round(len(ok) / span, 2) if span > 0 else None,
        "ttft_ms": {"p50": _round(p50), "p99": _round(p99), "count": len(ttfts)},
        "errors": dict(Counter(s.status for s in ended if s.status != "OK")),
        "cpu_seconds": cpu,
        "client_cpu_seconds": round(window.client_end - window.client_start, 3),
        "router_cpu_s_per_1000_chats": round(router_cpu / len(ok) * 1000, 3)
        if router_cpu is not None and ok
        else None,
        "router_rss_bytes": {r.name: window.rss.get(r.name) for r in routers},
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _overhead(run: dict[str, Any], direct: dict[str, Any]) -> dict[str, float | None]:
    return {
        q: None
        if run["ttft_ms"][q] is None or direct["ttft_ms"][q] is None
        else round(run["ttft_ms"][q] - direct["ttft_ms"][q], 2)
        for q in ("p50", "p99")
    }


async def _run(
    name: str,
    addresses: Sequence[str],
    clients: int,
    options: CostOptions,
    mesh: CostMesh,
    routers: Sequence[Process],
) -> dict[str, Any]:
    """One closed-loop run: straight to the tier when `routers` is empty, else through them."""
    channels = open_channels(addresses, clients)
    label = f"{name}-{clients}"
    if routers:
        call = router_calls(channels, label, mesh.tier, options)
    else:
        call = tier_calls(channels, label, options)
    try:
        watched = [mesh.tier_process, *routers]
        samples, window = await closed_loop(call, clients, options, watched)
    finally:
        for channel in channels:
            await channel.close()
    await asyncio.sleep(PAUSE_S)
    return {"run": name, "clients": clients, **summarise(samples, window, options, routers)}


Ticker = Callable[[str], None]


async def run_cost_curve(
    mesh: CostMesh, options: CostOptions, ticker: Ticker | None = None
) -> dict[str, Any]:
    """Every level in turn: direct, one router, then all routers (when there are several)."""
    rows = []
    tier_address = [mesh.tier_process.address]
    for clients in options.levels:
        runs: list[tuple[str, list[str], list[Process]]] = [("direct", tier_address, [])]
        runs.append(("router", [mesh.routers[0].address], mesh.routers[:1]))
        if len(mesh.routers) > 1:
            every = [r.address for r in mesh.routers]
            runs.append((f"routers_{len(mesh.routers)}", every, mesh.routers))
        row: dict[str, Any] = {"clients": clients}
        for name, addresses, routers in runs:
            if ticker is not None:
                ticker(f"{name} x{clients}")
            result = await _run(name, addresses, clients, options, mesh, routers)
            if routers:
                result["overhead_ms"] = _overhead(result, row["direct"])
            row[name] = result
        rows.append(row)
    return {
        "benchmark": "router_cost_curve",
        "version": 1,
        "loop": "closed",
        "tier": mesh.tier,
        "levels": list(options.levels),
        "routers": [r.name for r in mesh.routers],
        "duration_s": options.duration_s,
        "warmup_s": options.warmup_s,
        "ramp_s": options.ramp,
        "max_tokens": options.max_tokens,
        "streams_per_channel": STREAMS_PER_CHANNEL,
        "cpu_time_source": "/proc/<pid>/stat utime+stime",
        "rows": rows,
    }
