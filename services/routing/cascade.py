"""The escalation cascade evaluated offline: the router's progressive gate `escalate`
(services/router/escalation.py), whose decision this scores on measured outcomes. The complexity
score picks the first tier, and a tier whose answer is unsure (geometric-mean token probability
below its confidence threshold) hands the request to the next tier up, small -> medium -> large.
The final tier's answer counts; every tier run is paid for.

`tune_cascade` searches the thresholds on a tuning split (vectorised over the grid, checked
against the router's own decision in the tests); `escalation_per_request` scores any thresholds
through `Escalation.run`, the decision the router runs. Pure numpy over measured outcomes, whose
`confidence` is that of the whole answer.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from services.common.tiers import TIER_NAMES
from services.router.complexity_model import ComplexityModel
from services.router.escalation import Escalation
from services.routing.intervals import PerRequest
from services.routing.outcomes import Outcome

# What the cascade is tuned for on the tuning split: the least misroute rate that keeps quality
# at least QUALITY x always-large's and cost at most COST x always-large's.
QUALITY = 0.98
COST = 0.25
SMALL_BELOW = (0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3)
MEDIUM_BELOW = (0.6, 0.7, 0.8, 0.85, 0.9, 1.01)
SMALL_CONFIDENCE = tuple(np.round(np.arange(0.9, 0.9901, 0.005), 4))
MEDIUM_CONFIDENCE = tuple(np.round(np.arange(0.95, 0.9951, 0.005), 4))


Cascade = Escalation  # the thresholds: small_below, medium_below, small/medium_confidence


@dataclass(frozen=True)
class _Split:
    """A split's outcomes as arrays (requests x tiers, tiers cheapest first)."""

    scores: np.ndarray  # (N,)
    correct: np.ndarray  # (N, 3) bool
    confidence: np.ndarray  # (N, 3)
    spend: np.ndarray  # (N, 3): price x output tokens
    label: np.ndarray  # (N,) cheapest correct tier's level, 3 when none

    @classmethod
    def of(
        cls, outcomes: Sequence[Outcome], model: ComplexityModel, costs: dict[str, float]
    ) -> _Split:
        levels = {t: i for i, t in enumerate(TIER_NAMES)}
        return cls(
            np.array([model.score(o.prompt) for o in outcomes]),
            np.array([[o.tiers[t].correct for t in TIER_NAMES] for o in outcomes]),
            np.array([[o.tiers[t].confidence for t in TIER_NAMES] for o in outcomes]),
            np.array([[costs[t] * o.tiers[t].tokens for t in TIER_NAMES] for o in outcomes]),
            np.array([levels.get(o.label, len(TIER_NAMES)) for o in outcomes]),
        )

    def run(self, cascade: Cascade) -> tuple[np.ndarray, np.ndarray]:
        """The final tier's level per request, and what the tiers run cost."""
        first = np.where(
            self.scores < cascade.small_below, 0, np.where(self.scores < cascade.medium_below, 1, 2)
        )
        unsure_small = self.confidence[:, 0] < cascade.small_confidence
        unsure_medium = self.confidence[:, 1] < cascade.medium_confidence
        via_medium = (first == 1) | ((first == 0) & unsure_small)
        final = np.where(first == 2, 2, np.where(via_medium, np.where(unsure_medium, 2, 1), 0))
        ran = np.stack([first == 0, via_medium, final == 2], axis=1)
        return final, (self.spend * ran).sum(axis=1)

    def figures(self, final: np.ndarray, spent: np.ndarray) -> tuple[float, float, float]:
        """Quality and cost against always-large, and the misroute rate."""
        rows = np.arange(len(final))
        correct = self.correct[rows, final]
        too_small = ~correct & (self.correct & (np.arange(3) > final[:, None])).any(axis=1)
        too_big = correct & (self.label < final)
        large_accuracy = self.correct[:, 2].mean()
        large_cost = self.spend[:, 2].mean()
        quality = correct.mean() / large_accuracy if large_accuracy else 0.0
        cost = spent.mean() / large_cost if large_cost else 0.0
        return float(quality), float(cost), float((too_small | too_big).mean())


def tune_cascade(
    model: ComplexityModel, tuning: Sequence[Outcome], costs: dict[str, float]
) -> Cascade:
    """The grid's cascade with the least misroute rate on `tuning` within QUALITY and COST (the
    cheaper of equals); with none within them, the one of highest quality."""
    split = _Split.of(tuning, model, costs)
    best: tuple[float, float, Cascade] | None = None
    fallback: tuple[float, Cascade] | None = None
    grid = itertools.product(SMALL_BELOW, MEDIUM_BELOW, SMALL_CONFIDENCE, MEDIUM_CONFIDENCE)
    for values in grid:
        cascade = Cascade(*(float(v) for v in values))
        quality, cost, misroute = split.figures(*split.run(cascade))
        if fallback is None or quality > fallback[0]:
            fallback = (quality, cascade)
        if quality >= QUALITY and cost <= COST and (best is None or (misroute, cost) < best[:2]):
            best = (misroute, cost, cascade)
    assert fallback is not None
    return best[2] if best is not None else fallback[1]


def cascade_per_request(
    outcomes: Sequence[Outcome], model: ComplexityModel, costs: dict[str, float], cascade: Cascade
) -> tuple[list[str], PerRequest]:
    """The final tier per request, and the per-request figures with the cost of every tier
    run."""
    final, spent = _Split.of(outcomes, model, costs).run(cascade)
    tiers = [TIER_NAMES[level] for level in final]
    return tiers, replace(PerRequest.of(outcomes, tiers, costs), cost=spent)


def escalation_per_request(
    outcomes: Sequence[Outcome],
    model: ComplexityModel,
    costs: dict[str, float],
    escalation: Escalation,
) -> tuple[list[str], PerRequest]:
    """What the router's gate does with each request, by its own decision (Escalation.run): the
    tier whose answer counts, and the per-request figures with the cost of every tier run."""
    tiers: list[str] = []
    spent: list[float] = []
    for outcome in outcomes:
        confidence = {t: outcome.tiers[t].confidence for t in TIER_NAMES}
        ran = escalation.run(model.score(outcome.prompt), confidence)
        tiers.append(ran[-1])
        spent.append(sum(costs[t] * outcome.tiers[t].tokens for t in ran))
    each = replace(PerRequest.of(outcomes, tiers, costs), cost=np.asarray(spent))
    return tiers, each


def first_tier_p99_ms(
    outcomes: Sequence[Outcome], model: ComplexityModel, escalation: Escalation
) -> float:
    """The p99 time of the gate's decision before any tier runs (the prompt's score, then its
    chain of tiers), in ms; what follows (an answer's confidence against a threshold) is one
    comparison."""
    samples = []
    for outcome in outcomes:
        start = time.perf_counter()
        escalation.chain(model.score(outcome.prompt))
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return samples[min(len(samples) - 1, int(len(samples) * 0.99))] if samples else 0.0
