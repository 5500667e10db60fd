"""The `escalate` gate of progressive chats: which tier answers first, by the chat's complexity
score, and whether a finished answer is sure enough or goes on to the next tier up, small ->
medium -> large, each new answer replacing the one before on the same stream. Confidence is the
answer's geometric-mean token probability. The one implementation of the decision: the router's
session core runs it live, `tiermesh route-eval` scores it offline on measured outcomes.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.common.tiers import TIER_NAMES


@dataclass(frozen=True)
class Escalation:
    """The gate's thresholds (the defaults are the ones tuned on the workload's dev split)."""

    small_below: float = 0.2  # score under this: small answers first
    medium_below: float = 1.01  # ... under this medium, else large (above 1: never large first)
    small_confidence: float = 0.945  # a small answer less sure than this goes on to medium
    medium_confidence: float = 0.99  # a medium answer less sure than this goes on to large

    def first_tier(self, score: float) -> str:
        if score < self.small_below:
            return "small"
        return "medium" if score < self.medium_below else "large"

    def chain(self, score: float) -> tuple[str, ...]:
        """The tiers a chat of this score may run, in order: its first tier up to large."""
        return TIER_NAMES[TIER_NAMES.index(self.first_tier(score)) :]

    def threshold(self, tier: str) -> float | None:
        """The confidence an answer of `tier` needs to end the chat; None for large (the top)."""
        return {"small": self.small_confidence, "medium": self.medium_confidence}.get(tier)

    def escalates(self, tier: str, confidence: float) -> bool:
        """Whether a finished answer of `tier` with this confidence goes on to the next tier."""
        threshold = self.threshold(tier)
        return threshold is not None and confidence < threshold

    def run(self, score: float, confidence: Mapping[str, float]) -> tuple[str, ...]:
        """Every tier a chat runs when each tier's answer would have `confidence[tier]`; the
        last is the one whose answer counts."""
        ran: list[str] = []
        for tier in self.chain(score):
            ran.append(tier)
            if not self.escalates(tier, confidence[tier]):
                break
        return tuple(ran)
