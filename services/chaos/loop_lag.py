"""How late the chaos client's own event loop runs: every latency `tiermesh chaos` reports (a
refusal's, a failover gap) is timed on that loop, so a loop that wakes late adds to them. A task
sleeps `interval_s` again and again and keeps how much later than asked it woke, with the run's
clock; the report gives the lag over a fault's window beside the latencies measured in it.

Knows asyncio only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from services.common.percentiles import percentile

INTERVAL_S = 0.05


class LoopLag:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (run clock s, lag s), in time order

    async def follow(self, now: Callable[[], float]) -> None:
        """Samples until cancelled; `now` is the run's clock."""
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = time.perf_counter() - asked - self.interval_s
            self.samples.append((now(), max(0.0, lag)))

    def summary_ms(self, start_s: float = 0.0, end_s: float = float("inf")) -> dict[str, Any]:
        """p50, p99 and max of the lag sampled within [start_s, end_s] of the run's clock."""
        lags = [lag * 1000 for at, lag in self.samples if start_s <= at <= end_s]
        p50, p99 = percentile(lags, 0.50), percentile(lags, 0.99)
        return {
            "p50": None if p50 is None else round(p50, 1),
            "p99": None if p99 is None else round(p99, 1),
            "max": round(max(lags), 1) if lags else None,
        }
