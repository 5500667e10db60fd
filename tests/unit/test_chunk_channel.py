"""The typed channel a decode thread streams one request's chunks through to the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.tier.chunk_channel import ChunkChannel


async def _drain(channel: ChunkChannel[int]) -> list[int]:
    return [item async for item in channel]


async def test_items_from_a_thread_arrive_in_order_then_the_end() -> None:
    channel: ChunkChannel[int] = ChunkChannel(asyncio.get_running_loop(), capacity=50)

    def produce() -> None:
        for i in range(50):
            channel.put(i)
        channel.close()

    thread = threading.Thread(target=produce)
    thread.start()
    assert await _drain(channel) == list(range(50))
    thread.join()
    with pytest.raises(StopAsyncIteration):  # an ended channel stays ended
        await channel.__anext__()


async def test_a_failure_is_raised_to_the_consumer_after_the_items_before_it() -> None:
    channel: ChunkChannel[int] = ChunkChannel(asyncio.get_running_loop(), capacity=4)
    channel.put(1)
    channel.fail(RuntimeError("forward failed"))
    channel.close()  # only the first end counts
    received: list[int] = []
    with pytest.raises(RuntimeError, match="forward failed"):
        async for item in channel:
            received.append(item)
    assert received == [1]


async def test_the_bound_is_enforced_on_the_producer() -> None:
    channel: ChunkChannel[int] = ChunkChannel(asyncio.get_running_loop(), capacity=2)
    channel.put(1)
    channel.put(2)
    with pytest.raises(OverflowError, match="more than 2 items"):
        channel.put(3)
    channel.close()
    with pytest.raises(RuntimeError, match="after close"):
        channel.put(4)
    assert await _drain(channel) == [1, 2]


def test_capacity_must_be_positive() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="capacity"):
            ChunkChannel[int](loop, capacity=0)
    finally:
        loop.close()
