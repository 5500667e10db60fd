"""A progressive chat while tiers are still loading (chat_planning.plan_chat given `loading`): a
draft tier able to answer starts at once, whatever its refine tier is doing; with no draft, the
chat waits for a loading tier as a routed one does (TiersLoading)."""

from __future__ import annotations

import pytest
from tiermesh.v1 import router_pb2

from services.common.config import RouterConfig
from services.router.chat_planning import check_chat_request, plan_chat
from services.router.fallback import TiersLoading

CONFIG = RouterConfig(progressive_gate="always")
STARTING = "has not reported its load yet"

# (tiers down while starting, planned tiers or None for TiersLoading)
CASES = [
    ((), ("small", "large")),
    (("large",), ("small", "medium")),  # refined by medium, the able one
    (("medium", "large"), ("small", "large")),  # the draft answers now; large tried all the same
    (("small", "medium", "large"), None),  # nothing able: wait for one to load
    (("small",), ("large",)),  # no draft: the refine tier answers alone
]


@pytest.mark.parametrize(("starting", "tiers"), CASES)
def test_a_draft_never_waits_for_its_refinement(
    starting: tuple[str, ...], tiers: tuple[str, ...] | None
) -> None:
    request = router_pb2.ChatRequest(prompt="Where is my order?", mode=router_pb2.MODE_PROGRESSIVE)
    chat = check_chat_request(request, CONFIG)

    def down(tier: str) -> str | None:
        return STARTING if tier in starting else None

    def plan() -> tuple[str, ...]:
        return plan_chat(chat, CONFIG, {}, down, loading=lambda t: t in starting).tiers

    if tiers is None:
        with pytest.raises(TiersLoading):
            plan()
    else:
        assert plan() == tiers
