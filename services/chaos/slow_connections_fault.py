"""The slow-connections fault of `tiermesh chaos`: the attack of slow_connections.py aimed at the
gateway (half-open HTTP/1.1) or the router (unfinished HTTP/2 prefaces), with, beside it, what a
normal client sees and what the target holds:

- `probes`: short streamed chats, one after the other, before the attack (`unloaded`) and during
  it, over a connection opened before it (`kept`: kept alive for HTTP, one channel for gRPC) and
  over a new connection each (`fresh`): answered, refused, failed, and the kept ones' time to
  first token (p50, p99, and p99 against the unloaded p99);
- `descriptors`: the target process's open descriptors before, at their peak during, and after
  the attack (`after`: once they are back near `before`, or after SETTLE_S), and its soft limit;
- `descriptor_exhaustion_in_log`: lines of the target's log that say `Too many open files`.

Knows processes, the SDK, the bench's stream timings and the attack; nothing of the services'
code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tiermesh.client import AsyncRouterClient

from services.bench.openai_target import StreamTiming, grpc_stream, openai_stream
from services.bench.sse_client import SsePool
from services.chaos.faults import GATEWAY
from services.chaos.slow_connections import attack
from services.common.child_process import Child
from services.common.descriptors import process_descriptors
from services.common.percentiles import percentile

PROBE_PROMPT = "Where is my order?"
PROBE_MAX_TOKENS = 8
PROBE_GAP_S = 0.25  # between two probes of a kind
UNLOADED_PROBES = 40
SAMPLE_S = 0.25  # descriptor samples
SETTLE_S = 15.0  # after the attack, how long the target's descriptors may take to come back
SETTLED_SLACK = 16  # "back" means within this many of the count before the attack
EXHAUSTION = "Too many open files"

Probe = Callable[[], Awaitable[StreamTiming]]


@dataclass(frozen=True)
class SlowConnectionsSettings:
    connections: int = 2000  # the attack's connections (reopened when the target closes one)
    processes: int = 4  # worker processes, each from its own loopback address
    reopen_s: float = 5.0  # a connection the target closed is opened again after this
    # the attack's processes run this many nice levels below this one: on a machine they share
    # with the mesh, their own CPU would otherwise be counted as the target's slowness
    nice: int = 19


@dataclass
class _ProbeSeries:
    timings: list[StreamTiming] = field(default_factory=list)

    def summary(self, unloaded_p99: float | None = None) -> dict[str, Any]:
        statuses = Counter(t.status for t in self.timings)
        ttfts = [t.chunk_times_s[0] * 1000 for t in self.timings if t.ok and t.chunk_times_s]
        p99 = percentile(ttfts, 0.99)
        out: dict[str, Any] = {
            "sent": len(self.timings),
            "answered": statuses.pop("OK", 0),
            "failed": dict(statuses),
            "ttft_ms_p50": _round(percentile(ttfts, 0.50)),
            "ttft_ms_p99": _round(p99),
        }
        if unloaded_p99:
            out["ttft_p99_vs_unloaded"] = None if p99 is None else round(p99 / unloaded_p99, 2)
        return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def soft_open_files_limit(pid: int) -> int | None:
    """The soft RLIMIT_NOFILE of process `pid` (Linux /proc; None if it cannot be read)."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    value = line.split()[3]
                    return None if value == "unlimited" else int(value)
    except (OSError, ValueError, IndexError):
        return None
    return None


def log_mentions(child: Child, text: str) -> int:
    try:
        return child.log_path.read_text(errors="replace").count(text)
    except OSError:
        return 0


@contextlib.asynccontextmanager
async def _probes(
    target: str, gateway: str | None, router: str
) -> AsyncIterator[tuple[Probe, Probe]]:
    """(kept, fresh): one probe chat over a connection kept across probes, and one over a new
    connection each time, to the gateway (`target` GATEWAY) or the router."""
    if target == GATEWAY:
        if gateway is None:
            raise ValueError("the gateway is not running")
        url = f"http://{gateway}/v1"
        pool = SsePool(url)

        async def kept_http() -> StreamTiming:
            return await openai_stream(pool, url, "tiermesh-routed", PROBE_PROMPT, PROBE_MAX_TOKENS)

        async def fresh_http() -> StreamTiming:
            fresh = SsePool(url)
            try:
                return await openai_stream(
                    fresh, url, "tiermesh-routed", PROBE_PROMPT, PROBE_MAX_TOKENS
                )
            finally:
                fresh.close()

        try:
            yield kept_http, fresh_http
        finally:
            pool.close()
        return
    options = {"mode": "routed"}
    async with AsyncRouterClient(router) as client:

        async def kept_grpc() -> StreamTiming:
            return await grpc_stream(client, options, PROBE_PROMPT, PROBE_MAX_TOKENS)

        async def fresh_grpc() -> StreamTiming:
            async with AsyncRouterClient(router) as fresh:
                return await grpc_stream(fresh, options, PROBE_PROMPT, PROBE_MAX_TOKENS)

        yield kept_grpc, fresh_grpc


async def _sample_descriptors(pid: int, peak: list[int]) -> None:
    while True:
        count = process_descriptors(pid)
        if count is not None:
            peak[0] = max(peak[0], count)
        await asyncio.sleep(SAMPLE_S)


async def inject_slow_connections(
    target: str,
    child: Child,
    gateway: str | None,
    router: str,
    hold_s: float,
    settings: SlowConnectionsSettings,
    attack_starts: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Runs the attack on `child` (the gateway or the router) for `hold_s` with probes beside
    it; the fault's detail (module docstring). `attack_starts` is called when the unloaded
    probes are done and the attack begins."""
    if child.process is None:
        raise ValueError(f"{child.name} is not running")
    pid = child.process.pid
    host, _, port = child.address.rpartition(":")
    kind = "http" if target == GATEWAY else "h2"
    before = process_descriptors(pid)
    peak = [before or 0]
    async with _probes(target, gateway, router) as (kept, fresh):
        unloaded = _ProbeSeries()
        for _ in range(UNLOADED_PROBES):
            unloaded.timings.append(await kept())
            await asyncio.sleep(PROBE_GAP_S)
        attack_starts()
        sampler = asyncio.create_task(_sample_descriptors(pid, peak))
        attacking = asyncio.create_task(
            attack(
                host,
                int(port),
                kind,
                settings.connections,
                hold_s,
                processes=settings.processes,
                reopen_s=settings.reopen_s,
                nice=settings.nice,
            )
        )
        during, during_fresh = _ProbeSeries(), _ProbeSeries()

        async def probe_loop(probe: Probe, series: _ProbeSeries) -> None:
            await asyncio.sleep(min(2.0, hold_s / 4))  # the attack's connections are open
            while not attacking.done():
                series.timings.append(await probe())
                await asyncio.sleep(PROBE_GAP_S)

        try:
            await asyncio.gather(probe_loop(kept, during), probe_loop(fresh, during_fresh))
            tally = await attacking
        finally:
            attacking.cancel()
            sampler.cancel()
        after, settle_ms = await _settled(pid, before)
    unloaded_p99 = percentile(
        [t.chunk_times_s[0] * 1000 for t in unloaded.timings if t.ok and t.chunk_times_s], 0.99
    )
    return {
        "attack": {
            "kind": kind,
            "processes": settings.processes,
            "hold_s": hold_s,
            "reopen_s": settings.reopen_s,
            "nice": settings.nice,
            **tally.to_json(),
        },
        "descriptors": {
            "before": before,
            "peak": peak[0],
            "after": after,
            "settled_ms": settle_ms,
            "soft_limit": soft_open_files_limit(pid),
        },
        "probes": {
            "unloaded": unloaded.summary(),
            "kept": during.summary(unloaded_p99),
            "fresh": during_fresh.summary(),
        },
        "descriptor_exhaustion_in_log": log_mentions(child, EXHAUSTION),
    }


async def _settled(pid: int, before: int | None) -> tuple[int | None, float | None]:
    """The target's descriptors once back within SETTLED_SLACK of `before` (and how long that
    took), or after SETTLE_S (None: not back)."""
    began = time.perf_counter()
    count = process_descriptors(pid)
    while time.perf_counter() - began < SETTLE_S:
        count = process_descriptors(pid)
        if before is None or count is None or count <= before + SETTLED_SLACK:
            return count, round((time.perf_counter() - began) * 1000, 1)
        await asyncio.sleep(SAMPLE_S)
    return count, None
