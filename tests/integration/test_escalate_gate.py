"""The escalate gate through a real router and real torch tiers (the tiny model on each): the
complexity score picks the first tier, an answer less sure than its tier's threshold is replaced
on the same stream by the next tier's (revisions 0, 1, 2), a sure one ends the chat with no
other tier called. Thresholds of 0 and 1 make every answer sure or unsure, whatever the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiermesh.client import AsyncRouterClient, RevisionStartEvent, RouteEvent

from tests.integration.test_routing_policies import (
    SIMPLE,
    _mesh,
    artifact,  # noqa: F401  (the module fixture, shared)
)

EVERY_ANSWER_UNSURE = {"escalate_small_confidence": 1.0, "escalate_medium_confidence": 1.0}


@pytest.mark.parametrize(
    ("gate", "revisions", "words"),
    [
        # small first (every score under 1.01), each answer unsure: small, medium, then large
        (
            {"escalate_small_below": 1.01, **EVERY_ANSWER_UNSURE},
            ["small", "medium", "large"],
            "itself unsure",
        ),
        # small first, its answer sure: small alone
        ({"escalate_small_below": 1.01, "escalate_small_confidence": 0.0}, ["small"], "confident"),
        # medium first (no score under 0), unsure: medium, then large
        ({"escalate_small_below": 0.0, **EVERY_ANSWER_UNSURE}, ["medium", "large"], "unsure"),
    ],
)
async def test_an_unsure_answer_is_replaced_by_the_next_tier_up(
    tiny_model_dir: Path,
    artifact: Path,  # noqa: F811
    gate: dict[str, Any],
    revisions: list[str],
    words: str,
) -> None:
    mesh = await _mesh(tiny_model_dir, artifact, progressive_gate="escalate", **gate)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(SIMPLE, mode="progressive", max_tokens=6)
    finally:
        await mesh.stop()
    route = result.events[0]
    assert isinstance(route, RouteEvent) and route.tiers == tuple(
        ["small", "medium", "large"][["small", "medium", "large"].index(revisions[0]) :]
    )
    assert f"escalate: {revisions[0]} first" in route.reason
    started = [e for e in result.events if isinstance(e, RevisionStartEvent)]
    assert [(e.revision, e.tier) for e in started] == list(enumerate(revisions))
    assert (result.revision, result.tier) == (len(revisions) - 1, revisions[-1])
    assert words in result.final.reason
    assert [u["tier"] for u in result.final.usage] == revisions  # no other tier was called
