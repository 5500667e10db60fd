"""The first chunk of a tier call, read ahead: the stream with that chunk put back in front, and
the race between a call whose first chunk is late and its backup on another tier.

Knows tier calls and asyncio; knows nothing of revisions or the wire events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tiermesh.v1 import tier_pb2

from services.router.tier_calls import TierCall

Chunks = AsyncIterator[tier_pb2.GenerateChunk]


async def first_chunk_race(
    call: TierCall,
    chunks: Chunks,
    first: asyncio.Future[Any],
    backup: TierCall,
    racing: list[asyncio.Future[Any]],
) -> tuple[TierCall, Chunks]:
    """Whichever of `call` (its first chunk pending in `first`) and `backup` streams first
    wins, with its chunks; the other is cancelled. A call that fails loses. The backup's read
    is added to `racing`, which the caller cancels if it stops early."""
    backup_chunks = backup.chunks()
    second = asyncio.ensure_future(anext(backup_chunks))
    racing.append(second)
    done, _ = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
    if first in done and not first.exception():
        second.cancel()
        backup.cancel()
        return call, prepend(first, chunks)
    first.cancel()
    call.cancel()
    return backup, prepend(second, backup_chunks)


async def prepend(first: asyncio.Future[Any], rest: Chunks) -> Chunks:
    """The chunk `first` resolves to, then the rest of the stream. A stream that ended before
    any chunk simply ends; a failed one raises its error."""
    try:
        yield await first
    except StopAsyncIteration:
        return
    async for chunk in rest:
        yield chunk
