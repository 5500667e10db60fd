"""Bounded admission for a tier: a fixed number of running slots and a bounded wait queue.

Past both limits a request is refused at once (Overloaded), never queued without bound.
Knows nothing of models or gRPC. Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.common.errors import Overloaded


class Admission:
    def __init__(self, max_running: int, max_queued: int) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.running = 0
        self.queued = 0
        self.rejected = 0
        self._slots = asyncio.Semaphore(max_running)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Holds one running slot for the body; waits in the bounded queue if none is free."""
        if self.running + self.queued >= self.max_running + self.max_queued:
            self.rejected += 1
            raise Overloaded(
                f"tier at capacity: {self.running} running, {self.queued} queued "
                f"(limits {self.max_running} and {self.max_queued})"
            )
        self.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()
