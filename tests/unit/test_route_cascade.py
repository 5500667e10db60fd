"""The offline escalation cascade (services/routing/cascade.py): which tiers run and what they
cost, per request, for a table of scores and answer confidences; and its tuning's targets."""

from __future__ import annotations

import numpy as np
import pytest

from services.common.config import RouterConfig
from services.router.complexity_model import ComplexityModel
from services.routing.cascade import (
    COST,
    QUALITY,
    Cascade,
    cascade_per_request,
    escalation_per_request,
    tune_cascade,
)
from services.routing.outcomes import Outcome, TierOutcome
from services.routing.route_eval import route_eval
from tests.unit.test_routing_offline import COSTS, synthetic


class FixedScores(ComplexityModel):
    """A fake predictor: the score is the number the prompt starts with."""

    def __init__(self) -> None:
        super().__init__(np.zeros((3, 1)), np.zeros(3))

    def score(self, text: str) -> float:
        return float(text.split()[0])


CASCADE = Cascade(small_below=0.3, medium_below=0.7, small_confidence=0.9, medium_confidence=0.95)


def outcome(score: float, confidence: tuple[float, float, float], correct: str) -> Outcome:
    """Tokens 10, 20, 40 for small, medium, large; `correct` names the tiers that answer."""
    tiers = {
        tier: TierOutcome(tier[0] in correct, tokens, sure)
        for tier, tokens, sure in zip(COSTS, (10, 20, 40), confidence, strict=True)
    }
    return Outcome("x", "medium", f"{score} q", tiers)


@pytest.mark.parametrize(
    ("score", "confidence", "correct", "final", "cost", "too_small", "too_big"),
    [
        # sure small answer: small alone
        (0.1, (0.99, 0.99, 0.99), "sml", "small", 0.5, 0, 0),
        # unsure small answer goes on to medium, which is sure: both paid
        (0.1, (0.5, 0.99, 0.99), "ml", "medium", 0.5 + 5.0, 0, 0),
        # unsure small, unsure medium: all three paid; small would have answered (too big)
        (0.1, (0.5, 0.5, 0.99), "sml", "large", 0.5 + 5.0 + 40.0, 0, 1),
        # scored for medium: small never runs; a sure wrong medium answer stays (too small)
        (0.5, (0.1, 0.99, 0.99), "l", "medium", 5.0, 1, 0),
        # scored for large: large alone, whatever the confidences
        (0.9, (0.1, 0.1, 0.1), "l", "large", 40.0, 0, 0),
    ],
)
def test_which_tiers_run_and_what_they_cost(
    score: float,
    confidence: tuple[float, float, float],
    correct: str,
    final: str,
    cost: float,
    too_small: int,
    too_big: int,
) -> None:
    request = outcome(score, confidence, correct)
    # the tuning's vectorised run and the router's own decision (Escalation.run) agree
    for per_request in (cascade_per_request, escalation_per_request):
        tiers, each = per_request([request], FixedScores(), COSTS, CASCADE)
        assert tiers == [final]
        assert each.cost[0] == pytest.approx(cost)
        assert (each.too_small[0], each.too_big[0]) == (too_small, too_big)
        assert each.correct[0] == (final[0] in correct)


def test_the_tuned_cascade_keeps_its_targets_on_the_tuning_split() -> None:
    # simple requests: small answers, sure; medium: small answers wrongly but unsure
    requests = [outcome(0.1, (0.99, 0.99, 0.99), "sml") for _ in range(80)]
    requests += [outcome(0.1, (0.6, 0.99, 0.99), "ml") for _ in range(20)]
    cascade = tune_cascade(FixedScores(), requests, COSTS)
    tiers, each = cascade_per_request(requests, FixedScores(), COSTS, cascade)
    assert tiers == ["small"] * 80 + ["medium"] * 20  # the oracle's routing
    assert each.correct.mean() >= QUALITY and each.cost.mean() <= COST * 40.0
    assert (each.too_small + each.too_big).sum() == 0


def test_route_eval_reports_the_cascade_only_with_a_tuning_split() -> None:
    model = ComplexityModel.load()
    dev = synthetic("dev", 90)
    assert "cascade" not in route_eval(dev, dev, model, COSTS, feedback_steps=0)
    row = route_eval(dev, dev, model, COSTS, feedback_steps=0, tuning=dev)["cascade"]
    assert row["name"] == "cascade" and set(row["tuned_on_dev"]) == set(CASCADE.__dict__)
    for field in ("accuracy", "cost", "quality_vs_large", "cost_vs_large", "misroute_rate"):
        low, high = row[f"{field}_ci95"]
        assert low <= row[field] <= high, field


def test_route_eval_reports_the_routers_escalate_gate_as_configured() -> None:
    model = ComplexityModel.load()
    dev = synthetic("dev", 90)
    row = route_eval(dev, dev, model, COSTS, feedback_steps=0)["escalate"]
    config = RouterConfig()
    assert row["thresholds"] == {
        "small_below": config.escalate_small_below,
        "medium_below": config.escalate_medium_below,
        "small_confidence": config.escalate_small_confidence,
        "medium_confidence": config.escalate_medium_confidence,
    }
    low, high = row["misroute_rate_ci95"]
    assert low <= row["misroute_rate"] <= high
    assert row["p99_route_ms"] > 0  # the gate's decision before any tier runs, measured
