"""The routing policy's view of a PINNED or PROGRESSIVE chat, whose tiers do not depend on it: the
router works it out once the first tier call is in flight, and RouteDecision and the routing
lessons still get it (real router, real torch tiers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, FinalEvent, RouteEvent

from services.router.policy import heuristic_complexity
from tests.integration.mesh import Mesh, start_mesh

# numbers and chained steps: a high interim-heuristic complexity, far from 0
PROMPT = "Calculate the total for 3 items at 20.50 each plus shipping, with a 15% discount"


@pytest.fixture
async def mesh(tiny_model_dir: Path) -> AsyncIterator[Mesh]:
    mesh = await start_mesh(tiny_model_dir)
    yield mesh
    await mesh.stop()


@pytest.mark.parametrize("mode", ["pinned", "progressive"])
async def test_route_decision_carries_the_policys_complexity(mesh: Mesh, mode: str) -> None:
    tier = "small" if mode == "pinned" else ""
    async with AsyncRouterClient(mesh.address) as client:
        events = [e async for e in client.chat_stream(PROMPT, mode=mode, tier=tier, max_tokens=6)]
        route = events[0]
        assert isinstance(route, RouteEvent)
        assert route.complexity == pytest.approx(heuristic_complexity(PROMPT))
        assert route.complexity > 0.5
        assert isinstance(events[-1], FinalEvent)
        # the routing lessons remembered the chat with the policy's choice: feedback is taken
        assert await client.feedback(route.request_id, 1.0) is True
