"""A typed, bounded, one-way channel from a decode thread to the asyncio task that streams one
request: the thread puts items, then closes or fails it; the task iterates and gets the items,
then the end of the stream or the error raised.

Knows asyncio and threads; nothing of models, torch or gRPC.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _End:
    """The last thing a channel carries: the end of the stream, or the error that ended it."""

    error: BaseException | None = None


class ChunkChannel(Generic[T]):
    """Carries at most `capacity` items, then one end.

    put(), close() and fail() are called from one producer thread at a time, in order (the
    torch engine's critical lane hands a request to its batch loop through a queue), never from
    the loop's (they schedule onto the loop and return at once, so a decode thread never waits
    for a slow consumer). Iteration happens on the loop. The bound is the request's own: an
    engine sizes the channel to the most chunks the request can produce (max_tokens), and a put
    past it is a bug, raised as OverflowError on the producer thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        self._loop = loop
        self._capacity = capacity
        self._queue: asyncio.Queue[T | _End] = asyncio.Queue(maxsize=capacity + 1)
        self._sent = 0  # producer side only
        self._ended = False  # producer side only
        self._done = False  # consumer side only

    def put(self, item: T) -> None:
        """Sends one item. Raises OverflowError past capacity, RuntimeError after the end."""
        if self._ended:
            raise RuntimeError("channel: put after close or fail")
        if self._sent >= self._capacity:
            raise OverflowError(f"channel: more than {self._capacity} items")
        self._sent += 1
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def close(self) -> None:
        """Ends the stream. Only the first close() or fail() counts."""
        self._end(_End())

    def fail(self, error: BaseException) -> None:
        """Ends the stream with `error`, which the consumer raises."""
        self._end(_End(error))

    def _end(self, end: _End) -> None:
        if not self._ended:
            self._ended = True
            self._loop.call_soon_threadsafe(self._queue.put_nowait, end)

    def __aiter__(self) -> ChunkChannel[T]:
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, _End):
            self._done = True
            if item.error is not None:
                raise item.error
            raise StopAsyncIteration
        return item
