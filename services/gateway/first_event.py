"""A streamed response starts at its first event: the stream's first event is awaited before
the caller sends the HTTP status, so that a failure before it (a chat refused, overload, no tier
holding the model) is still an HTTP error with its Retry-After, and a failure after it is the
stream's error event, its last.

Knows GatewayError; no ASGI and no API's format (the caller says what its error event is).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TypeVar

from services.gateway.errors import GatewayError

T = TypeVar("T")


async def first_event(
    events: AsyncIterator[T], failure: Callable[[GatewayError], T]
) -> tuple[T, AsyncIterator[T]]:
    """`events`' first event, once it is ready, and the rest of them. A GatewayError before the
    first event is raised (nothing was sent: the caller answers with its status); one after it
    is turned into `failure(error)`, the rest's last event. A stream without events is a
    RuntimeError: a stream ends with its answer or its error."""
    try:
        first = await anext(events)
    except StopAsyncIteration:
        raise RuntimeError("the stream ended before its first event") from None
    return first, _after_first(events, failure)


async def _after_first(
    events: AsyncIterator[T], failure: Callable[[GatewayError], T]
) -> AsyncGenerator[T, None]:
    """The events after the first; a GatewayError among them ends them as `failure(error)`."""
    try:
        async for event in events:
            yield event
    except GatewayError as e:
        yield failure(e)
