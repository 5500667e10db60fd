"""Chat through a real router and real torch tiers: event order, revisions, modes, failures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tiermesh.client import (
    AsyncRouterClient,
    ChatError,
    DeltaEvent,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
)

from services.router.revisions import common_prefix_chars
from tests.integration.mesh import Mesh, start_mesh
from tests.tiny_model import build_tiny_model

PROMPT = "What is your return policy?"


@pytest.fixture(scope="module")
def second_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same tokenizer shape, other weights: the large tier answers differently from the small."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-b"), seed=7)


@pytest.fixture
async def mesh(tiny_model_dir: Path) -> AsyncIterator[Mesh]:
    mesh = await start_mesh(tiny_model_dir)
    yield mesh
    await mesh.stop()


def texts_by_revision(events: list) -> dict[int, str]:
    texts: dict[int, str] = {}
    for event in events:
        if isinstance(event, DeltaEvent):
            texts[event.revision] = texts.get(event.revision, "") + event.text
    return texts


async def test_progressive_streams_draft_then_refinement(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        events = [
            e
            async for e in client.chat_stream(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=24
            )
        ]
    kinds = [type(e).__name__ for e in events]
    assert isinstance(events[0], RouteEvent)
    assert events[0].tiers == ("small", "large")
    assert isinstance(events[1], RevisionStartEvent)
    assert (events[1].revision, events[1].tier, events[1].replaces) == (0, "small", None)
    end0 = kinds.index("RevisionEndEvent")
    assert all(isinstance(e, DeltaEvent) and e.revision == 0 for e in events[2:end0])
    start1 = events[end0 + 1]
    assert isinstance(start1, RevisionStartEvent)
    assert (start1.revision, start1.tier, start1.replaces) == (1, "large", 0)
    assert isinstance(events[-2], RevisionEndEvent) and events[-2].revision == 1
    final = events[-1]
    assert isinstance(final, FinalEvent)
    assert kinds.count("FinalEvent") == 1
    texts = texts_by_revision(events)
    assert final.revision == 1 and final.tier == "large"
    assert final.text == texts[1]
    assert start1.kept_prefix_chars == common_prefix_chars(texts[0], texts[1])
    assert final.revisions == 2
    assert final.timings["time_to_first_draft_ms"] <= final.timings["time_to_final_ms"]
    assert {u["tier"] for u in final.usage} == {"small", "large"}


async def test_progressive_kept_prefix_with_different_models(
    tiny_model_dir: Path, second_model_dir: Path
) -> None:
    mesh = await start_mesh(tiny_model_dir, models={"large": second_model_dir})
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=16
            )
        texts = texts_by_revision(result.events)
        assert texts[0] != texts[1]
        start1 = next(
            e for e in result.events if isinstance(e, RevisionStartEvent) and e.revision == 1
        )
        assert start1.kept_prefix_chars == common_prefix_chars(texts[0], texts[1])
        assert result.text == texts[1]
    finally:
        await mesh.stop()


async def test_pinned_uses_the_named_tier_only(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        result = await client.chat(PROMPT, mode="pinned", tier="medium", max_tokens=8)
    route = result.events[0]
    assert isinstance(route, RouteEvent) and route.tiers == ("medium",)
    assert result.tier == "medium" and result.revision == 0
    assert [u["tier"] for u in result.final.usage] == ["medium"]
    assert result.final.model.startswith("medium/") and result.final.model != "medium/"
    assert result.final.usage[0]["completion_tokens"] == len(
        [t for e in result.events if isinstance(e, DeltaEvent) for t in e.token_ids]
    )


async def test_routed_chooses_by_complexity(mesh: Mesh) -> None:
    hard = (
        "I want 3 mugs at 12.50 each and 2 teapots at 30 each with a 15% discount, "
        "plus shipping of 7 dollars: what is the total?"
    )
    async with AsyncRouterClient(mesh.address) as client:
        easy = await client.chat(PROMPT, max_tokens=4)
        complex_ = await client.chat(hard, max_tokens=4)
    assert easy.tier == "small"
    assert complex_.tier == "large"
    route = complex_.events[0]
    assert isinstance(route, RouteEvent)
    assert route.policy == "interim_heuristic" and route.complexity >= 0.7


async def test_progressive_with_refine_tier_down_is_refined_by_its_fallback(
    tiny_model_dir: Path,
) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("small", "medium"), down=("large",))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=8
            )
        route = result.events[0]
        assert isinstance(route, RouteEvent) and route.tiers == ("small", "medium")
        assert "large load stream broken (UNAVAILABLE) → refined by medium" in route.reason
        assert (result.revision, result.tier) == (1, "medium")
        assert result.final.reason == "refined by medium"
    finally:
        await mesh.stop()


async def test_progressive_with_no_refine_tier_up_ends_on_the_draft(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("small",), down=("medium", "large"))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=8
            )
        assert result.revision == 0 and result.tier == "small"
        assert "refinement by large failed" in result.final.reason
        assert "UNAVAILABLE" in result.final.reason
        assert not any(isinstance(e, RevisionStartEvent) and e.revision == 1 for e in result.events)
    finally:
        await mesh.stop()


async def test_progressive_refine_over_budget_keeps_the_draft(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, router_options={"refine_budget_ms": 1})
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=64
            )
        assert result.revision == 0
        assert "exceeded its 1 ms budget" in result.final.reason
        await mesh.wait_idle("large")
    finally:
        await mesh.stop()


async def test_progressive_with_draft_tier_down_answers_from_refine(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("medium", "large"), down=("small",))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=8
            )
        assert (result.revision, result.tier, result.final.revisions) == (0, "large", 1)
        route = result.events[0]
        assert isinstance(route, RouteEvent) and route.tiers == ("large",)
        assert "small load stream broken (UNAVAILABLE): no draft" in route.reason
        assert result.final.reason == "no draft; answered by large"
    finally:
        await mesh.stop()


async def test_routed_with_its_tier_down_falls_back_and_pinned_is_unavailable(
    tiny_model_dir: Path,
) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("medium", "large"), down=("small",))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(PROMPT, mode="routed", max_tokens=8)
            route = result.events[0]
            assert isinstance(route, RouteEvent) and route.tiers == ("medium",)
            assert "small load stream broken (UNAVAILABLE)" in route.reason
            assert "fallback medium" in route.reason
            assert (result.revision, result.tier) == (0, "medium")
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8)
        assert caught.value.code == "UNAVAILABLE"
        assert "tier small" in caught.value.message
    finally:
        await mesh.stop()


async def test_feedback_accepts_known_request_ids(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        result = await client.chat(PROMPT, max_tokens=2, request_id="req-42")
        assert isinstance(result.events[0], RouteEvent)
        assert result.events[0].request_id == "req-42"
        assert await client.feedback("req-42", 0.9) is True
        assert await client.feedback("never-seen", 0.9) is False
        with pytest.raises(ChatError) as caught:
            await client.feedback("req-42", 1.5)
    assert caught.value.code == "INVALID_ARGUMENT" and "score" in caught.value.message
