"""What a progressive chat's gate says when one of its answers ends: whether the answer is sure
enough to end the chat, which tier takes an unsure one further, and the words Final.reason uses
for it. The gates themselves are the router config's (`always`, `race`, `cascade`, `escalate`:
escalation.py holds escalate's thresholds).

Pure: the chat's plan and an answer's tier and confidence in, a decision and its text out; no
calls, no clock. The session core (session_core.py) acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.router.chat_plan import ChatPlan


@dataclass(frozen=True)
class Settled:
    """A finished draft that ends the chat: why, and what became of its refinement."""

    reason: str
    refinement: str  # "cancelled" (it had started) or "skipped"


def answer_threshold(plan: ChatPlan, tier: str) -> float:
    """The confidence a finished answer of `tier` needs to end the chat (escalate: its tier's
    threshold, none for the top of the chain; the other gates: min_draft_confidence)."""
    if plan.escalation is None:
        return plan.min_confidence
    threshold = plan.escalation.threshold(tier)
    return 0.0 if threshold is None else threshold


def tier_above(plan: ChatPlan, tier: str) -> str | None:
    """The tier that refines an unsure answer of `tier`: the next of the plan's chain
    (escalate; None past its end), else the refine tier."""
    tiers = plan.tiers
    if plan.escalation is None:
        return tiers[-1]
    index = tiers.index(tier) if tier in tiers else len(tiers)
    return tiers[index + 1] if index + 1 < len(tiers) else None


def settled_draft(
    plan: ChatPlan, tier: str, confidence: float, refinement_started: bool
) -> Settled | None:
    """A complete draft of `tier` with this confidence ends the chat (the gate is not `always`,
    and the draft is sure enough or nothing is above it); None: it goes on to be refined."""
    threshold, above = answer_threshold(plan, tier), tier_above(plan, tier)
    if plan.gate == "always" or (confidence < threshold and above is not None):
        return None
    if above is None:
        return Settled(f"answered by {tier}, the top of the chain; refinement skipped", "skipped")
    verdict = "cancelled" if refinement_started else "skipped"
    sure = f"{confidence:.2f} >= {threshold_text(threshold)}"
    return Settled(f"draft confident ({sure}); refinement {verdict}", verdict)


def unsure(plan: ChatPlan, tier: str, confidence: float) -> str:
    """An answer's confidence against its tier's threshold, as reasons show it: 0.90 < 0.945."""
    return f"{confidence:.2f} < {threshold_text(answer_threshold(plan, tier))}"


def escalates_to(plan: ChatPlan, tier: str, confidence: float) -> str | None:
    """escalate: the next tier up when a finished refinement of `tier` is unsure too (None: it
    is the answer, or the gate is another)."""
    if plan.escalation is None:
        return None
    above = tier_above(plan, tier)
    return above if above is not None and confidence < answer_threshold(plan, tier) else None


def refined(plan: ChatPlan, tier: str, draft_unsure: str) -> str:
    """Final.reason's words for a refinement of `tier` that is the answer."""
    if plan.gate == "always":
        return f"refined by {tier}"
    return f"refined by {tier} (draft unsure: {draft_unsure})"


def threshold_text(threshold: float) -> str:
    """A threshold as configured: two decimals, three where it has them (0.50, 0.945)."""
    return f"{threshold:.2f}" if round(threshold, 2) == threshold else f"{threshold:.3f}"
