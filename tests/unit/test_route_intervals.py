"""Bootstrap intervals of routing figures (services/routing/intervals.py) on synthetic
outcomes whose truth is known: the misroute split, paired ratios, seeded repeatability, groups."""

from __future__ import annotations

import numpy as np
import pytest

from services.routing.intervals import PerRequest, Resampler
from services.routing.outcomes import Outcome, TierOutcome

COSTS = {"small": 0.05, "medium": 0.25, "large": 1.0}


def outcome(n: int, request_class: str, phrasing: str = "seen") -> Outcome:
    """simple: every tier answers; complex: only large; 10 tokens each."""
    correct = {"simple": {"small", "medium", "large"}, "complex": {"large"}}[request_class]
    tiers = {t: TierOutcome(t in correct, 10, 0.9) for t in COSTS}
    return Outcome(str(n), request_class, f"q{n}", tiers, phrasing)


# 60 simple (20 of them unseen phrasings), 40 complex
OUTCOMES = [outcome(n, "simple", "unseen" if n < 20 else "seen") for n in range(60)] + [
    outcome(60 + n, "complex") for n in range(40)
]
LARGE = PerRequest.of(OUTCOMES, ["large"] * 100, COSTS)


@pytest.mark.parametrize(
    ("choices", "too_small", "too_big", "accuracy"),
    [
        (["small"] * 100, 0.4, 0.0, 0.6),  # complex sent small: too small
        (["large"] * 100, 0.0, 0.6, 1.0),  # simple sent large: too big
        (["small"] * 60 + ["large"] * 40, 0.0, 0.0, 1.0),  # the oracle
        (["medium"] * 100, 0.4, 0.6, 0.6),  # both ways wrong
    ],
)
def test_the_misroute_split_and_its_intervals(
    choices: list[str], too_small: float, too_big: float, accuracy: float
) -> None:
    policy = PerRequest.of(OUTCOMES, choices, COSTS)
    report = Resampler(OUTCOMES).report(policy, LARGE)
    overall = report["overall"]
    assert (overall["misroute_too_small"], overall["misroute_too_big"]) == (too_small, too_big)
    for field, value in (
        ("misroute_too_small", too_small),
        ("misroute_too_big", too_big),
        ("misroute_rate", too_small + too_big),
        ("accuracy", accuracy),
    ):
        low, high = overall[f"{field}_ci95"]
        assert low <= value <= high, (field, value, low, high)
        # an exact figure (every request the same) has no spread; a mixed one has some
        mixed = 0 < value < 1
        assert (high - low > 0.05) == mixed, (field, low, high)


def test_ratios_against_large_are_paired_and_groups_resampled_apart() -> None:
    report = Resampler(OUTCOMES).report(LARGE, LARGE)
    assert report["overall"]["quality_vs_large_ci95"] == [1.0, 1.0]
    assert report["overall"]["cost_vs_large_ci95"] == [1.0, 1.0]
    small = PerRequest.of(OUTCOMES, ["small"] * 100, COSTS)
    groups = Resampler(OUTCOMES).report(small, LARGE)
    assert set(groups["phrasing"]) == {"seen", "unseen"}
    assert set(groups["class"]) == {"simple", "complex"}
    assert groups["class"]["simple"]["accuracy_ci95"] == [1.0, 1.0]  # small answers all simple
    assert groups["class"]["complex"]["accuracy_ci95"] == [0.0, 0.0]
    assert groups["class"]["simple"]["cost_vs_large_ci95"] == [0.05, 0.05]


def test_the_same_seed_gives_the_same_intervals() -> None:
    choices = list(np.random.default_rng(3).choice(list(COSTS), size=100))
    policy = PerRequest.of(OUTCOMES, choices, COSTS)
    first = Resampler(OUTCOMES, seed=5).report(policy, LARGE)
    assert Resampler(OUTCOMES, seed=5).report(policy, LARGE) == first
    assert Resampler(OUTCOMES, seed=6).report(policy, LARGE) != first
