"""Timed bursts for `tiermesh bench engine`: N streams started at once, each a source of token-id
chunks, timed from the burst's start; a level's row (tokens/s, TTFT p50/p99, TPOT) from its timed
bursts; and the resident memory of a process with its children (read from /proc, Linux only).

Knows nothing of engines, gRPC or HTTP: a stream is any async iterator of token-id lists, so the
torch engine, vLLM, a tier over gRPC and an OpenAI server are timed by the same code.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.percentiles import percentile

if TYPE_CHECKING:
    from services.tier.linear_kernels import LayoutChoice

Stream = Callable[[], AsyncIterator[list[int]]]  # one request: its chunks' token ids


@dataclass
class LevelResult:
    engine: str
    concurrency: int
    tokens: int
    seconds: float
    tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms: float  # mean time per output token after the first, per stream
    outputs: list[list[int]] | None = None  # generated ids per stream, sorted (not reported)
    linear_layout: LayoutChoice | None = None  # the engine's (not reported per row)


def level_result(
    engine: str,
    concurrency: int,
    tokens: int,
    seconds: float,
    firsts: list[float],
    tpots: list[float],
) -> LevelResult:
    """A row from its totals: `firsts` are TTFTs in ms, `tpots` per-stream ms per token."""
    return LevelResult(
        engine=engine,
        concurrency=concurrency,
        tokens=tokens,
        seconds=round(seconds, 4),
        tokens_per_s=round(tokens / seconds, 2),
        ttft_ms_p50=round(statistics.median(firsts), 3),
        ttft_ms_p99=round(percentile(firsts, 0.99) or 0.0, 3),
        tpot_ms=round(statistics.fmean(tpots), 3) if tpots else 0.0,
    )


@dataclass(frozen=True)
class StreamTiming:
    tokens: list[int]  # every generated id, in order
    first_s: float  # first token, seconds after the burst started
    last_s: float  # last token, likewise


@dataclass(frozen=True)
class Burst:
    streams: list[StreamTiming]  # in the order the streams were given
    seconds: float  # from the start to the last stream's end


async def timed_burst(streams: list[Stream]) -> Burst:
    """Starts every stream at once and times each chunk from the burst's start."""
    start = time.perf_counter()

    async def one(stream: Stream) -> StreamTiming:
        first = last = 0.0
        tokens: list[int] = []
        async for ids in stream():
            if not ids:
                continue
            now = time.perf_counter() - start
            if not tokens:
                first = now
            last = now
            tokens.extend(ids)
        return StreamTiming(tokens, first, last)

    timings = await asyncio.gather(*(one(s) for s in streams))
    return Burst(list(timings), time.perf_counter() - start)


def level_from_bursts(engine: str, concurrency: int, bursts: list[Burst]) -> LevelResult:
    """One row over the timed bursts: TTFT and TPOT over every stream, tokens/s over the bursts'
    summed time."""
    timings = [t for burst in bursts for t in burst.streams]
    tokens = sum(len(t.tokens) for t in timings)
    tpots = [
        (t.last_s - t.first_s) / (len(t.tokens) - 1) * 1000 for t in timings if len(t.tokens) > 1
    ]
    firsts = [t.first_s * 1000 for t in timings]
    return level_result(engine, concurrency, tokens, sum(b.seconds for b in bursts), firsts, tpots)


def descendants(parents: dict[int, int], root: int) -> set[int]:
    """`root` and every process below it, given each process's parent."""
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        for child in children:
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(name)] = int(fields[1])  # after the command name: state, then ppid
    return parents


def tree_memory(root: int) -> dict[str, int]:
    """Resident bytes of `root` and its descendants: "rss" now and "hwm", the sum of each
    process's own peak (an upper bound of the tree's peak)."""
    from services.bench.resources import process_memory

    total = {"rss": 0, "hwm": 0}
    for pid in descendants(_parents(), root):
        memory = process_memory(pid)
        for key in total:
            total[key] += memory.get(key, 0)
    return total
