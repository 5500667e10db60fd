"""The kept-prefix rule for replacing revisions, and the interim routing policy."""

from __future__ import annotations

import pytest

from services.router.policy import InterimHeuristicPolicy, RoutingInput, heuristic_complexity
from services.router.revisions import KeptPrefix, common_prefix_chars


def test_common_prefix_chars() -> None:
    assert common_prefix_chars("The total is 30", "The total is 36") == 14
    assert common_prefix_chars("", "abc") == 0
    assert common_prefix_chars("héllo", "hélp") == 3


def test_kept_prefix_decided_on_divergence() -> None:
    kept = KeptPrefix("Returns within 30 days.")
    assert kept.feed("Returns ") is None  # still a prefix of the draft: undecided
    assert kept.feed("within 14") == len("Returns within ")


def test_kept_prefix_decided_when_covering_the_previous_text() -> None:
    kept = KeptPrefix("Yes.")
    assert kept.feed("Ye") is None
    assert kept.feed("s. And more") == 4


def test_kept_prefix_at_end_of_a_shorter_revision() -> None:
    kept = KeptPrefix("Returns within 30 days.")
    assert kept.feed("Returns") is None
    assert kept.at_end() == len("Returns")


@pytest.mark.parametrize(
    ("text", "tier"),
    [
        ("What is your return policy?", "small"),
        ("How much are 3 mugs at 12 dollars each?", "medium"),
        (
            "I want 3 mugs at 12.50 each and 2 teapots at 30 each with a 15% discount, "
            "plus shipping of 7 dollars: what is the total?",
            "large",
        ),
    ],
)
def test_interim_policy_thresholds(text: str, tier: str) -> None:
    policy = InterimHeuristicPolicy()
    loads = dict.fromkeys(("small", "medium", "large"))
    choice = policy.route(RoutingInput((("user", text),), 64), loads)
    assert choice.tier == tier
    assert choice.policy == "interim_heuristic"
    assert f"{heuristic_complexity(text):.2f}" in choice.reason
    assert 0.0 <= choice.complexity <= 1.0
