"""A progressive chat's gate when an answer ends (services/router/progressive_verdicts.py): a
table of gates, tiers and confidences against the decision and the words Final.reason uses."""

from __future__ import annotations

import pytest
from tiermesh.v1 import router_pb2, tier_pb2

from services.router.chat_plan import ChatPlan
from services.router.escalation import Escalation
from services.router.progressive_verdicts import (
    Settled,
    escalates_to,
    refined,
    settled_draft,
    tier_above,
    unsure,
)

ESCALATION = Escalation(small_confidence=0.945, medium_confidence=0.99)


def plan(gate: str, tiers: tuple[str, ...] = ("small", "large")) -> ChatPlan:
    return ChatPlan(
        request_id="r",
        mode=router_pb2.MODE_PROGRESSIVE,
        tiers=tiers,
        generate=tier_pb2.GenerateRequest(),
        decision=router_pb2.RouteDecision(),
        gate=gate,
        min_confidence=0.9,
        escalation=ESCALATION if gate == "escalate" else None,
    )


CHAIN = ("small", "medium", "large")

# (gate, chain, the draft's tier, its confidence, a refinement started, what the gate says)
DRAFTS = [
    ("always", ("small", "large"), "small", 0.99, True, None),
    (
        "race",
        ("small", "large"),
        "small",
        0.95,
        True,
        Settled("draft confident (0.95 >= 0.90); refinement cancelled", "cancelled"),
    ),
    ("race", ("small", "large"), "small", 0.85, True, None),
    (
        "cascade",
        ("small", "large"),
        "small",
        0.90,
        False,
        Settled("draft confident (0.90 >= 0.90); refinement skipped", "skipped"),
    ),
    (
        "escalate",
        CHAIN,
        "small",
        0.95,
        False,
        Settled("draft confident (0.95 >= 0.945); refinement skipped", "skipped"),
    ),
    ("escalate", CHAIN, "small", 0.94, False, None),
    ("escalate", ("medium", "large"), "medium", 0.98, False, None),
    (
        "escalate",
        ("large",),
        "large",
        0.10,
        False,
        Settled("answered by large, the top of the chain; refinement skipped", "skipped"),
    ),
]


@pytest.mark.parametrize(("gate", "chain", "tier", "confidence", "started", "says"), DRAFTS)
def test_a_finished_draft(
    gate: str,
    chain: tuple[str, ...],
    tier: str,
    confidence: float,
    started: bool,
    says: Settled | None,
) -> None:
    assert settled_draft(plan(gate, chain), tier, confidence, started) == says


@pytest.mark.parametrize(
    ("gate", "chain", "tier", "above"),
    [
        ("always", ("small", "large"), "small", "large"),
        ("race", ("small", "large"), "small", "large"),
        ("escalate", CHAIN, "small", "medium"),
        ("escalate", CHAIN, "medium", "large"),
        ("escalate", CHAIN, "large", None),
        ("escalate", ("medium", "large"), "small", None),  # not in the chain
    ],
)
def test_the_tier_above(gate: str, chain: tuple[str, ...], tier: str, above: str | None) -> None:
    assert tier_above(plan(gate, chain), tier) == above


@pytest.mark.parametrize(
    ("gate", "tier", "confidence", "to"),
    [
        ("escalate", "medium", 0.95, "large"),  # a refinement unsure too goes up
        ("escalate", "medium", 0.995, None),
        ("escalate", "large", 0.10, None),  # the top of the chain is the answer
        ("always", "large", 0.10, None),  # only escalate goes on
    ],
)
def test_an_unsure_refinement_escalates(
    gate: str, tier: str, confidence: float, to: str | None
) -> None:
    assert escalates_to(plan(gate, CHAIN), tier, confidence) == to


def test_the_words_of_the_reason() -> None:
    escalate = plan("escalate", CHAIN)
    assert unsure(escalate, "small", 0.9) == "0.90 < 0.945"
    assert unsure(escalate, "medium", 0.9) == "0.90 < 0.99"
    assert unsure(plan("race"), "small", 0.5) == "0.50 < 0.90"
    assert (
        refined(escalate, "medium", "0.90 < 0.945")
        == "refined by medium (draft unsure: 0.90 < 0.945)"
    )
    assert refined(plan("always"), "large", "0.90 < 0.90") == "refined by large"
