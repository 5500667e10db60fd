"""Routing policies against a real router and real torch tiers: trained thresholds, load-aware
fallback from the tiers' own load reports, first-token timeout fallback, progressive gates, and
adaptive routing learning from Feedback and refinements."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, FinalEvent, RouteEvent

from services.router.policy import TierLoad
from services.routing.predictor_training import train_model
from tests.integration.mesh import Mesh, hold_stream, start_mesh
from tests.unit.test_routing_offline import synthetic

SIMPLE = "What is your return policy?"
COMPLEX = (
    "Please price an order of 2 navy bottles, 4 pink spoons and 3 green bowls. "
    "I have coupon SAVE10. How much will I pay in total?"
)
LONG = {"max_tokens": 400}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = replace(train_model(synthetic("train", 600)), small_below=0.3, medium_below=0.7)
    path = tmp_path_factory.mktemp("predictor") / "complexity_model.npz"
    model.save(path)
    return path


async def _mesh(model_dir: Path, artifact: Path, tiers: dict | None = None, **router) -> Mesh:
    options = {"complexity_model": str(artifact), "load_watch_interval_ms": 50, **LONG, **router}
    return await start_mesh(
        model_dir,
        tier_options={**LONG, **(tiers or {})},
        router_options=options,
    )


async def _large_load_until(mesh: Mesh, condition: Callable[[TierLoad], bool]) -> None:
    """Waits (up to 4 s) until the router's last load report of the large tier meets
    `condition`."""
    loads = mesh.router.watcher.loads
    for _ in range(200):
        load = loads["large"]
        if load is not None and condition(load):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"large tier's load never met the condition: {loads['large']}")


async def test_threshold_policy_routes_by_trained_complexity(tiny_model_dir, artifact) -> None:
    mesh = await _mesh(tiny_model_dir, artifact, policy="threshold")
    try:
        async with AsyncRouterClient(mesh.address) as client:
            easy = await client.chat(SIMPLE, max_tokens=4)
            hard = await client.chat(COMPLEX, max_tokens=4)
        assert (easy.tier, hard.tier) == ("small", "large")
        route = hard.events[0]
        assert isinstance(route, RouteEvent) and route.policy == "threshold"
        assert route.complexity >= 0.7 and "complexity" in route.reason
    finally:
        await mesh.stop()


async def test_full_large_tier_falls_back_by_its_own_load_report(tiny_model_dir, artifact) -> None:
    mesh = await _mesh(
        tiny_model_dir, artifact, tiers={"max_running": 1, "max_queued": 0}, policy="cost_target"
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, SIMPLE, mode="pinned", tier="large", max_tokens=400)
            )
            await asyncio.wait_for(ready.wait(), 10)
            await _large_load_until(mesh, lambda load: load.queue_full)
            result = await client.chat(COMPLEX, max_tokens=4)
            holder.cancel()
        route = result.events[0]
        assert isinstance(route, RouteEvent)
        assert result.tier == "medium", route.reason
        assert "large full" in route.reason and "fallback medium" in route.reason
    finally:
        await mesh.stop()


@pytest.mark.parametrize(
    ("min_success", "tier", "words"),
    [(0.5, "large", "large queue 1 >= 1, kept: medium answers it"), (0.0, "medium", "→ medium")],
)
async def test_a_queued_large_tier_keeps_what_only_it_answers(
    tiny_model_dir, artifact, min_success, tier, words
) -> None:
    mesh = await _mesh(
        tiny_model_dir,
        artifact,
        tiers={"max_running": 1, "max_queued": 8},
        policy="threshold",
        large_queue_limit=1,
        queue_fallback_min_success=min_success,
        # the policy's queue limit alone decides: the large tier's expected wait (2 s, once its
        # report catches up) must not step the chat down past the 1 s interactive budget
        interactive_wait_budget_ms=60_000,
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            pinned = {"mode": "pinned", "tier": "large", "max_tokens": 400}
            holders = [asyncio.create_task(hold_stream(client, ready, SIMPLE, **pinned))]
            await asyncio.wait_for(ready.wait(), 10)  # one running on large
            holders.append(
                asyncio.create_task(hold_stream(client, asyncio.Event(), SIMPLE, **pinned))
            )
            await _large_load_until(mesh, lambda load: load.queued >= 1)  # ...and one queued
            stream = client.chat_stream(COMPLEX, max_tokens=4)
            route = await anext(stream)  # decided while large's queue is at the limit
            for holder in holders:
                holder.cancel()
            final = [e async for e in stream if isinstance(e, FinalEvent)]
        assert isinstance(route, RouteEvent) and words in route.reason, route.reason
        assert route.tiers == (tier,) and final and final[0].tier == tier
    finally:
        await mesh.stop()


async def test_late_first_token_starts_the_fallback_tier(tiny_model_dir, artifact) -> None:
    mesh = await _mesh(
        tiny_model_dir,
        artifact,
        tiers={"max_running": 1, "max_queued": 4},
        policy="threshold",
        first_token_timeout_ms=100,
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, SIMPLE, mode="pinned", tier="small", max_tokens=400)
            )
            await asyncio.wait_for(ready.wait(), 10)
            result = await client.chat(SIMPLE, max_tokens=4)  # waits in small's queue
            holder.cancel()
        assert result.tier == "medium"
        assert "no first token from small within 100 ms" in result.final.reason
        usage = {u["tier"]: u for u in result.final.usage}
        assert usage["small"]["cancelled"] and not usage["medium"]["cancelled"]
        await mesh.wait_idle("small")
    finally:
        await mesh.stop()


@pytest.mark.parametrize(
    ("gate", "confidence", "revision", "words"),
    [
        ("race", 0.0, 0, "refinement cancelled"),
        ("cascade", 0.0, 0, "refinement skipped"),
        ("cascade", 1.0, 1, "draft unsure"),
        ("race", 1.0, 1, "draft unsure"),
    ],
)
async def test_progressive_gates(tiny_model_dir, artifact, gate, confidence, revision, words):
    mesh = await _mesh(
        tiny_model_dir, artifact, progressive_gate=gate, min_draft_confidence=confidence
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(SIMPLE, mode="progressive", max_tokens=8)
        assert result.revision == revision
        assert words in result.final.reason
        route = result.events[0]
        assert isinstance(route, RouteEvent) and f"gate {gate}" in route.reason
        status = await mesh.wait_idle("large")
        if gate == "cascade" and revision == 0:
            assert status.completed == 0 and [u["tier"] for u in result.final.usage] == ["small"]
    finally:
        await mesh.stop()


async def test_adaptive_learns_from_feedback_and_refinements(tiny_model_dir, artifact) -> None:
    mesh = await _mesh(tiny_model_dir, artifact, policy="adaptive")
    try:
        policy = mesh.router.servicer._policy
        async with AsyncRouterClient(mesh.address) as client:
            routed = await client.chat(SIMPLE, max_tokens=4, request_id="a-1")
            route = routed.events[0]
            assert isinstance(route, RouteEvent) and route.policy == "adaptive"
            assert policy.updates == 0
            assert await client.feedback("a-1", 1.0)
            assert policy.updates == 1
            await client.chat(SIMPLE, mode="progressive", progressive_gate="always", max_tokens=4)
            assert policy.updates == 3  # the draft tier and the refine tier
    finally:
        await mesh.stop()
