"""How fast the router's chats in flight finish: the exponential average of the time between
two chats finishing, and from it the retry delay a chat refused at capacity is given (when the
next slot should free up), instead of a fixed guess.

Pure bookkeeping over a clock it is given; knows nothing of gRPC. Not thread-safe: one loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FIRST_RETRY_S = 0.5  # before any chat has finished: about one short answer on a busy tier
RETRY_BOUNDS_S = (0.05, 5.0)  # a retry delay never shorter or longer than these
WEIGHT = 0.2  # weight of the newest interval in the average


class DrainRate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: float | None = None
        self.interval_s: float | None = None  # mean time between two chats finishing

    def finished(self) -> None:
        """A chat in flight ended (answered, failed or cancelled): a slot is free."""
        now = self._clock()
        if self._last is not None:
            gap = now - self._last
            mean = self.interval_s
            self.interval_s = gap if mean is None else mean + WEIGHT * (gap - mean)
        self._last = now

    def retry_after_s(self) -> float:
        """When a chat refused now should try again: the expected time to the next finish."""
        if self.interval_s is None:
            return FIRST_RETRY_S
        low, high = RETRY_BOUNDS_S
        return min(high, max(low, self.interval_s))
