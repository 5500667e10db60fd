"""A streamed response's first event: awaited before the HTTP status, a failure before it
raised for the status, a failure after it turned into the stream's last event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from services.gateway.errors import GatewayError
from services.gateway.first_event import first_event

REFUSED = GatewayError(429, "over the key's rate", retry_after_s=3)


async def stream(events: list[str], error: Exception | None) -> AsyncGenerator[str, None]:
    for event in events:
        await asyncio.sleep(0)
        yield event
    if error is not None:
        raise error


def error_event(error: GatewayError) -> str:
    return f"error {error.status}"


async def received(events: list[str], error: Exception | None) -> list[str]:
    """Every event the caller writes: the first, then the rest."""
    first, rest = await first_event(stream(events, error), error_event)
    return [first] + [event async for event in rest]


@pytest.mark.parametrize(
    ("events", "error", "expected"),
    [
        pytest.param(["a", "b", "c"], None, ["a", "b", "c"], id="every-event"),
        pytest.param(["a"], None, ["a"], id="one-event"),
        pytest.param(["a", "b"], REFUSED, ["a", "b", "error 429"], id="failure-after-events"),
        pytest.param(["a"], REFUSED, ["a", "error 429"], id="failure-after-the-first"),
    ],
)
def test_the_first_event_then_the_rest_ended_by_a_failure_event(
    events: list[str], error: Exception | None, expected: list[str]
) -> None:
    assert asyncio.run(received(events, error)) == expected


@pytest.mark.parametrize(
    ("events", "error", "raised"),
    [
        pytest.param([], REFUSED, GatewayError, id="failure-before-the-first"),
        pytest.param([], None, RuntimeError, id="no-events"),
        pytest.param(["a"], ValueError("bug"), ValueError, id="not-a-gateway-error"),
    ],
)
def test_a_failure_the_caller_answers_itself_is_raised(
    events: list[str], error: Exception | None, raised: type[Exception]
) -> None:
    with pytest.raises(raised) as caught:
        asyncio.run(received(events, error))
    if error is not None:
        assert caught.value is error  # the status, message and Retry-After as they were


def test_nothing_follows_the_failure_event() -> None:
    async def after_failure() -> list[str | None]:
        _, rest = await first_event(stream(["a"], REFUSED), error_event)
        return [await anext(rest, None) for _ in range(3)]

    assert asyncio.run(after_failure()) == ["error 429", None, None]
