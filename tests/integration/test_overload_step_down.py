"""Overload step-down through a real router and real torch tiers, from the tiers' own load
reports: with the large tier full, an interactive chat the policy sends there is answered by
medium and says so (route, Final.reason, RouteDecision.stepped_from); a batch chat is refused at
once; with overload = "shed" the chat goes the fallback chain's way as before; a key limited to
interactive may not ask for critical."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, ChatError, RevisionEndEvent, RouteEvent

from tests.integration.mesh import Mesh, hold_stream
from tests.integration.test_routing_policies import (
    COMPLEX,
    SIMPLE,
    _large_load_until,
    _mesh,
    artifact,  # noqa: F401  (the module fixture, shared)
)

FULL_LARGE = {"max_running": 1, "max_queued": 0}


async def _with_large_full(mesh: Mesh, client: AsyncRouterClient) -> asyncio.Task[object]:
    """Holds one long chat on large (one slot, no queue) until its load report says full."""
    ready = asyncio.Event()
    holder = asyncio.create_task(
        hold_stream(client, ready, SIMPLE, mode="pinned", tier="large", max_tokens=400)
    )
    await asyncio.wait_for(ready.wait(), 10)
    await _large_load_until(mesh, lambda load: load.queue_full)
    return holder


async def test_an_interactive_chat_steps_down_and_a_batch_chat_is_refused(
    tiny_model_dir: Path,
    artifact: Path,  # noqa: F811
) -> None:
    mesh = await _mesh(tiny_model_dir, artifact, tiers=FULL_LARGE, policy="threshold")
    try:
        async with AsyncRouterClient(mesh.address) as client:
            holder = await _with_large_full(mesh, client)
            result = await client.chat(COMPLEX, max_tokens=4)
            started = time.monotonic()
            with pytest.raises(ChatError) as refused:
                await client.chat(COMPLEX, max_tokens=4, priority="batch")
            refused_s = time.monotonic() - started
            holder.cancel()
        route = result.events[0]
        assert isinstance(route, RouteEvent)
        assert result.tier == "medium", route.reason
        assert (route.stepped_from, route.priority) == ("large", "interactive")
        assert "stepped down from large: large full" in route.reason
        assert result.final.reason.startswith("stepped down from large: large full")
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert refused.value.message.startswith("batch chat refused: large full")
        assert refused.value.details.retry_after_s is not None
        assert refused_s < 1.0  # refused by the router at once, never queued
    finally:
        await mesh.stop()


async def test_overload_max_tokens_shortens_a_stepped_chat_that_left_them_to_the_router(
    tiny_model_dir: Path,
    artifact: Path,  # noqa: F811
) -> None:
    mesh = await _mesh(
        tiny_model_dir, artifact, tiers=FULL_LARGE, policy="threshold", overload_max_tokens=3
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            holder = await _with_large_full(mesh, client)
            short = await client.chat(COMPLEX)  # max_tokens left to the router
            asked = await client.chat(COMPLEX, max_tokens=12)
            holder.cancel()
    finally:
        await mesh.stop()
    ends = [e for e in short.events if isinstance(e, RevisionEndEvent)]
    assert short.tier == "medium" and len(ends) == 1
    assert ends[0].usage["completion_tokens"] <= 3, ends[0]
    assert "max_tokens lowered to 3 under load" in short.final.reason
    route = short.events[0]
    assert isinstance(route, RouteEvent) and "max_tokens lowered to 3" in route.reason
    ends = [e for e in asked.events if isinstance(e, RevisionEndEvent)]
    assert asked.tier == "medium" and "lowered" not in asked.final.reason
    assert ends[0].usage["completion_tokens"] > 3 or ends[0].finish_reason == "stop"


async def test_shed_leaves_a_full_tier_to_the_fallback_chain(
    tiny_model_dir: Path,
    artifact: Path,  # noqa: F811
) -> None:
    mesh = await _mesh(
        tiny_model_dir, artifact, tiers=FULL_LARGE, policy="threshold", overload="shed"
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            holder = await _with_large_full(mesh, client)
            result = await client.chat(COMPLEX, max_tokens=4)
            holder.cancel()
        route = result.events[0]
        assert isinstance(route, RouteEvent)
        assert result.tier == "medium" and route.stepped_from == ""
        assert "stepped" not in route.reason and "fallback medium" in route.reason
    finally:
        await mesh.stop()
