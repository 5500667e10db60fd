"""Routing policies that do not learn online: `keyword` (the seed's baseline), `threshold`
(the trained complexity score with fixed thresholds, large only while its queue has room) and
`cost_target` (the same with thresholds tuned on dev to meet a quality target at least cost).
"""

from __future__ import annotations

import re

from services.common.tiers import TIER_NAMES
from services.router.complexity_model import ComplexityModel
from services.router.policy import Loads, RouteChoice, RoutingInput, band

# The seed's keyword router: words that suggest a computation or a multi-step order.
_LARGE_WORDS = re.compile(r"\b(total|coupon|discount|shipping|order of|altogether)\b", re.I)
_MEDIUM_WORDS = re.compile(r"\b(how much|cost|price|\d+ x|times)\b", re.I)


class KeywordPolicy:
    """Keyword lists: multi-step words → large, price/quantity words → medium, else small."""

    name = "keyword"

    def route(self, request: RoutingInput, loads: Loads) -> RouteChoice:
        text = request.user_text
        if match := _LARGE_WORDS.search(text):
            return RouteChoice("large", 1.0, self.name, f"keyword {match.group(0)!r} → large")
        if match := _MEDIUM_WORDS.search(text):
            return RouteChoice("medium", 0.5, self.name, f"keyword {match.group(0)!r} → medium")
        return RouteChoice("small", 0.0, self.name, "no keyword → small")

    def learn(self, choice: RouteChoice, tier: str, quality: float) -> None:
        return None


class ThresholdPolicy:
    """score < small_below → small, < medium_below → medium, else large while the large tier's
    queue is under `large_queue_limit`; past it, the fallback tier, but only for a request the
    fallback tier is likely to answer: the predictor's probability that its cheapest correct
    tier is the fallback tier or a cheaper one is at least `fallback_min_success` (0 = always
    fall back). A request only the large tier answers (a complex order: the medium tier gets
    few right) stays queued on large rather than taking a fast wrong answer; the tier's own
    admission still bounds that queue, and a full tier's calls take the router's load-aware
    fallback."""

    name = "threshold"

    def __init__(
        self,
        model: ComplexityModel,
        small_below: float = 0.3,
        medium_below: float = 0.7,
        large_queue_limit: int = 8,
        fallback_tier: str = "medium",
        fallback_min_success: float = 0.5,
    ) -> None:
        self._model = model
        self._small_below = small_below
        self._medium_below = medium_below
        self._large_queue_limit = large_queue_limit
        self._fallback_tier = fallback_tier
        self._fallback_min_success = fallback_min_success
        # index of the fallback tier among the predictor's classes (cheapest correct tier)
        self._fallback_level = TIER_NAMES.index(fallback_tier)

    @property
    def model(self) -> ComplexityModel:
        """The complexity predictor it routes by."""
        return self._model

    @property
    def thresholds(self) -> tuple[float, float]:
        """(small_below, medium_below) on the complexity score."""
        return self._small_below, self._medium_below

    @property
    def large_queue_limit(self) -> int:
        return self._large_queue_limit

    def route(self, request: RoutingInput, loads: Loads) -> RouteChoice:
        probs = self._model.probabilities(request.user_text)
        score = float(probs @ [0.0, 0.5, 1.0])
        tier, where = band(score, self._small_below, self._medium_below)
        reason = f"complexity {score:.2f} {where}"
        large = loads.get("large")
        if tier == "large" and large is not None and large.queued >= self._large_queue_limit:
            success = float(probs[: self._fallback_level + 1].sum())
            queue = f"large queue {large.queued} >= {self._large_queue_limit}"
            if success >= self._fallback_min_success:
                tier = self._fallback_tier
                reason += f"; {queue} → {tier} (answers it with p {success:.2f})"
            else:
                reason += (
                    f"; {queue}, kept: {self._fallback_tier} answers it with p {success:.2f}"
                    f" < {self._fallback_min_success:.2f}"
                )
        return RouteChoice(tier, score, self.name, reason, tuple(float(p) for p in probs))

    def learn(self, choice: RouteChoice, tier: str, quality: float) -> None:
        return None


class CostTargetPolicy(ThresholdPolicy):
    """ThresholdPolicy with the thresholds tuned on dev (stored in the model artifact) to keep
    a quality target at the least cost."""

    name = "cost_target"

    def __init__(
        self,
        model: ComplexityModel,
        large_queue_limit: int = 8,
        fallback_min_success: float = 0.5,
    ) -> None:
        super().__init__(
            model,
            model.small_below,
            model.medium_below,
            large_queue_limit=large_queue_limit,
            fallback_min_success=fallback_min_success,
        )
