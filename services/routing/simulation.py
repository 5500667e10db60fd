"""Offline evaluation of routing choices against measured outcomes: accuracy, cost, share per
tier and misroutes, with no servers involved. Pure Python over outcome records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.tiers import TIER_NAMES
from services.routing.outcomes import Outcome


@dataclass(frozen=True)
class RoutingResult:
    accuracy: float  # share of requests whose chosen tier answered correctly
    cost: float  # mean cost per request: tier price per output token x output tokens
    share: dict[str, float]  # share of requests per tier
    misroute_rate: (
        float  # wrong tier: failed while a costlier one succeeds, or costlier than needed
    )

    def to_json(self) -> dict[str, object]:
        return {
            "accuracy": round(self.accuracy, 4),
            "cost": round(self.cost, 4),
            "misroute_rate": round(self.misroute_rate, 4),
            "share": {t: round(v, 4) for t, v in self.share.items()},
        }


def misrouted(outcome: Outcome, tier: str) -> bool:
    """Sent to a tier that failed while a costlier one would have succeeded, or to a tier
    costlier than the cheapest correct one."""
    rank = TIER_NAMES.index(tier)
    if not outcome.tiers[tier].correct:
        return any(outcome.tiers[t].correct for t in TIER_NAMES[rank + 1 :] if t in outcome.tiers)
    cheapest = outcome.label
    return cheapest in TIER_NAMES and TIER_NAMES.index(cheapest) < rank


def evaluate_choices(
    outcomes: Sequence[Outcome], choices: Sequence[str], costs: dict[str, float]
) -> RoutingResult:
    n = max(1, len(outcomes))
    correct = sum(o.tiers[t].correct for o, t in zip(outcomes, choices, strict=True))
    cost = sum(costs[t] * o.tiers[t].tokens for o, t in zip(outcomes, choices, strict=True))
    counts = Counter(choices)
    wrong = sum(misrouted(o, t) for o, t in zip(outcomes, choices, strict=True))
    return RoutingResult(
        accuracy=correct / n,
        cost=cost / n,
        share={t: counts.get(t, 0) / n for t in TIER_NAMES},
        misroute_rate=wrong / n,
    )


def oracle_choice(outcome: Outcome) -> str:
    """The cheapest correct tier; the cheapest tier when none is correct."""
    return outcome.label if outcome.label in TIER_NAMES else TIER_NAMES[0]
