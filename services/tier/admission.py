"""Bounded admission for a tier: a fixed number of running slots and a bounded wait queue, with
refusals that come at once and say when to retry.

A request is refused at once (QueueRefused, RESOURCE_EXHAUSTED) when both limits are reached,
or when the queue's expected wait is longer than it may wait: its deadline, or `max_wait_s`.
A queued request still waiting after that long is refused then. The expected wait, which is also
the retry delay a refusal carries, comes from the queue: the requests ahead of it times the mean
time a running slot is held (measured, an exponential average), over the running slots. Knows
nothing of models or gRPC. Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from services.common.errors import Overloaded

MAX_WAIT_S = 5.0  # the longest a request without a shorter deadline waits for a running slot
FIRST_HOLD_S = 1.0  # a running slot's assumed hold time until one has been measured
HOLD_WEIGHT = 0.2  # weight of the newest hold time in the running average


class QueueRefused(Overloaded):
    """Refused by admission; `retry_after_s` is the queue's expected wait."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    def __init__(
        self,
        max_running: int,
        max_queued: int,
        max_wait_s: float = MAX_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.max_wait_s = max_wait_s
        self.running = 0
        self.queued = 0
        self.rejected = 0
        self.hold_s = FIRST_HOLD_S  # mean time a running slot is held, measured as they end
        self._measured = False
        self._clock = clock
        self._slots = asyncio.Semaphore(max_running)

    def expected_wait_s(self) -> float:
        """How long a request arriving now would wait for a running slot: 0 while one is free,
        else (queued + 1) slot hand-overs at max_running slots per hold time."""
        if self.running < self.max_running and self.queued == 0:
            return 0.0
        return (self.queued + 1) * self.hold_s / self.max_running

    def _refuse(self, why: str) -> QueueRefused:
        self.rejected += 1
        wait = max(self.expected_wait_s(), self.hold_s / self.max_running)
        return QueueRefused(
            f"tier at capacity: {why} ({self.running} running, {self.queued} queued, limits "
            f"{self.max_running} and {self.max_queued}; expected wait {wait:.2f} s)",
            retry_after_s=wait,
        )

    @asynccontextmanager
    async def slot(self, deadline_s: float | None = None) -> AsyncIterator[None]:
        """Holds one running slot for the body; waits in the bounded queue if none is free, at
        most min(deadline_s, max_wait_s) seconds. `deadline_s`: the seconds the request has
        left, None = no deadline. Raises QueueRefused without waiting when it could not start
        in time by the queue's expected wait."""
        budget = self.max_wait_s if deadline_s is None else min(deadline_s, self.max_wait_s)
        if self.running + self.queued >= self.max_running + self.max_queued:
            raise self._refuse("queue full")
        if self.expected_wait_s() > budget:
            raise self._refuse(f"it could not start within {budget:.2f} s")
        self.queued += 1
        try:
            async with asyncio.timeout(budget):
                await self._slots.acquire()
        except TimeoutError:
            raise self._refuse(f"no running slot within {budget:.2f} s") from None
        finally:
            self.queued -= 1
        self.running += 1
        started = self._clock()
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()
            self._note_hold(self._clock() - started)

    def _note_hold(self, seconds: float) -> None:
        if not self._measured:
            self.hold_s, self._measured = seconds, True
        else:
            self.hold_s += HOLD_WEIGHT * (seconds - self.hold_s)
