"""A tier's utilisation over a sliding window: tokens streamed per second, the mean share of its
KV-cache pool in use, and the share of the time a loop spent working (BusyWindow: the batch
scheduler's decode loop).

Plain bookkeeping on a monotonic clock, bounded by the window; knows nothing of gRPC or engines.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 5.0
MAX_SAMPLES = 4096  # bounds each window however often it is fed


class RecentUtilisation:
    """Tokens streamed and KV-pool use samples over the last `window_s` seconds."""

    def __init__(
        self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._started = clock()
        self._tokens: deque[tuple[float, int]] = deque(maxlen=MAX_SAMPLES)
        self._pool: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)

    def add_tokens(self, count: int) -> None:
        """Counts `count` tokens streamed now."""
        if count > 0:
            self._tokens.append((self._clock(), count))

    def sample_pool(self, used: int, capacity: int) -> None:
        """Records the pool's use now (nothing without a pool)."""
        if capacity > 0:
            self._pool.append((self._clock(), min(1.0, used / capacity)))

    def tokens_per_s(self) -> float:
        """Tokens over the window (or over the time since start, when shorter), per second."""
        now = self._clock()
        _drop_before(self._tokens, now - self._window_s)
        span = min(self._window_s, now - self._started)
        return sum(count for _, count in self._tokens) / span if span > 0 else 0.0

    def kv_pool_use_share(self) -> float:
        """Time-weighted mean of the pool's use over the window (0 with no samples)."""
        now = self._clock()
        start = now - self._window_s
        # keep the last sample before the window: it holds the pool's use at the window's start
        while len(self._pool) > 1 and self._pool[1][0] <= start:
            self._pool.popleft()
        if not self._pool:
            return 0.0
        total = weighted = 0.0
        points = list(self._pool)
        for (at, share), following in zip(points, [p[0] for p in points[1:]] + [now], strict=True):
            length = following - max(at, start)
            if length > 0:
                total += length
                weighted += share * length
        return weighted / total if total > 0 else points[-1][1]


def _drop_before(samples: deque[tuple[float, int]], start: float) -> None:
    while samples and samples[0][0] < start:
        samples.popleft()


class BusyWindow:
    """The share of the last `window_s` seconds a loop spent working. Spans are added by the
    loop's thread; share() may be read from any thread (a deque copy is atomic)."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._spans: deque[tuple[float, float]] = deque(maxlen=8192)  # (start, end), monotonic

    def add(self, start: float, end: float) -> None:
        self._spans.append((start, end))

    def share(self, now: float | None = None) -> float:
        """Busy seconds within (now - window_s, now] over window_s, in [0, 1]."""
        now = time.monotonic() if now is None else now
        since = now - self.window_s
        busy = sum(
            min(end, now) - max(start, since) for start, end in list(self._spans) if end > since
        )
        return max(0.0, min(1.0, busy / self.window_s))
