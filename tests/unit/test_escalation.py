"""The escalate gate's decision (services/router/escalation.py) and its plan
(chat_planning.plan_chat), as tables of scenarios: the first tier by complexity score, whether an
answer goes on, the tiers a chat runs for given confidences, and the chain a plan holds."""

from __future__ import annotations

import pytest
from tiermesh.v1 import router_pb2

from services.common.config import RouterConfig
from services.common.config_loading import build_config
from services.router.chat_planning import check_chat_request, escalation_of, plan_chat
from services.router.escalation import Escalation
from services.router.policy import RouteChoice

GATE = Escalation()  # small below 0.2, never large first; small 0.945, medium 0.99

# score -> first tier
FIRST = [(0.0, "small"), (0.199, "small"), (0.2, "medium"), (0.99, "medium"), (1.0, "medium")]

# (score, confidence per tier) -> the tiers run, the last one's answer counts
RUNS = [
    (0.1, {"small": 0.95, "medium": 0.5, "large": 0.5}, ("small",)),
    (0.1, {"small": 0.94, "medium": 0.995, "large": 0.5}, ("small", "medium")),
    (0.1, {"small": 0.5, "medium": 0.98, "large": 0.1}, ("small", "medium", "large")),
    (0.5, {"small": 1.0, "medium": 0.99, "large": 0.1}, ("medium",)),  # never small above 0.2
    (0.5, {"small": 1.0, "medium": 0.989, "large": 0.1}, ("medium", "large")),
]


@pytest.mark.parametrize(("score", "tier"), FIRST)
def test_the_score_picks_the_first_tier(score: float, tier: str) -> None:
    assert GATE.first_tier(score) == tier
    assert GATE.chain(score)[0] == tier and GATE.chain(score)[-1] == "large"


@pytest.mark.parametrize(("score", "confidence", "ran"), RUNS)
def test_an_unsure_answer_goes_on_to_the_next_tier(
    score: float, confidence: dict[str, float], ran: tuple[str, ...]
) -> None:
    assert GATE.run(score, confidence) == ran


def test_large_never_escalates_and_large_first_is_configurable() -> None:
    assert not GATE.escalates("large", 0.0)
    assert Escalation(medium_below=0.7).first_tier(0.8) == "large"


def _plan(score: float, down: dict[str, str] | None = None) -> tuple[tuple[str, ...], str]:
    config = build_config(RouterConfig, {"tiers": {t: "x:1" for t in ("small", "medium", "large")}})
    request = router_pb2.ChatRequest(
        prompt="Hi", mode=router_pb2.MODE_PROGRESSIVE, progressive_gate="escalate"
    )
    chat = check_chat_request(request, config)
    choice = RouteChoice("small", score, "cost_target", "why")
    gone = down or {}
    plan = plan_chat(chat, config, {}, lambda t: gone.get(t), choice)
    assert plan.escalation == escalation_of(config) and plan.gate == "escalate"
    assert plan.decision.complexity == pytest.approx(score)
    return plan.tiers, plan.decision.reason


@pytest.mark.parametrize(
    ("score", "down", "tiers", "reason"),
    [
        (
            0.1,
            {},
            ("small", "medium", "large"),
            "escalate: small first (complexity 0.10); an "
            "answer under 0.945 confidence goes on to medium",
        ),
        (
            0.6,
            {},
            ("medium", "large"),
            "escalate: medium first (complexity 0.60); an answer "
            "under 0.990 confidence goes on to large",
        ),
        (
            0.1,
            {"medium": "medium down"},
            ("small", "large"),
            "escalate: small first (complexity "
            "0.10); an answer under 0.945 confidence goes on to large; medium down: passed over",
        ),
    ],
)
def test_the_plan_holds_the_chain_from_the_first_tier_up(
    score: float, down: dict[str, str], tiers: tuple[str, ...], reason: str
) -> None:
    assert _plan(score, down) == (tiers, reason)


@pytest.mark.parametrize("mode", [router_pb2.MODE_ROUTED, router_pb2.MODE_PINNED])
def test_the_configured_gate_escalate_leaves_other_modes_alone(
    mode: router_pb2.Mode.ValueType,
) -> None:
    tiers = {t: "x:1" for t in ("small", "medium", "large")}
    config = build_config(RouterConfig, {"tiers": tiers, "progressive_gate": "escalate"})
    request = router_pb2.ChatRequest(prompt="Hi", mode=mode, tier="medium")
    chat = check_chat_request(request, config)
    choice = RouteChoice("medium", 0.1, "cost_target", "why")
    plan = plan_chat(chat, config, {}, lambda t: None, choice)
    assert plan.tiers == ("medium",) and plan.escalation is None
