"""The three built-in tiers: model shapes, optimiser settings and shares of the training budget.

Knows only numbers; nothing of data, files or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

TIER_NAMES = ("small", "medium", "large")


@dataclass(frozen=True)
class TierRecipe:
    """How one tier's GPT-2-shaped model is built and trained."""

    tier: str
    n_layer: int
    n_embd: int
    n_head: int
    lr: float  # peak AdamW learning rate, after a linear warm-up, cosine-decayed to lr / 10
    budget_share: float  # fraction of the training budget (minutes) this tier trains for
    batch_tokens: int = 4096  # padded tokens per optimiser step (rows = batch_tokens // length)
    warmup_steps: int = 50
    weight_decay: float = 0.01
    n_positions: int = 256  # longest prompt + answer the model can see
    steps: int | None = None  # train exactly this many steps instead of the time budget
    # share of optimiser steps per kind of batch: simple, medium, complex, drill (see trainer)
    step_mix: tuple[float, float, float, float] = (0.05, 0.3, 0.5, 0.15)
    # a tier trained before this one whose checkpoint it starts from, grown (growth.py): twice as
    # wide at the same depth, and/or deeper at the same width
    grow_from: str | None = None
    # simple and medium requests reworded in training (services.workload.augment): other
    # templates, surface noise, off-domain questions answered with the fallback reply
    augment: bool = True


# Budgets (steps; minutes on a quiet 2-core machine with native bf16, packed batches): small 2,000
# (~6), medium 1,100 (~6), large 1,800 (~30); `tiermesh models train` takes ~43 minutes. The
# larger tiers get the longer budgets, as real small models are weaker for both reasons: at equal
# CPU time the smaller model takes ~3x the steps and wins, so the budget is part of what makes a
# tier a tier.
# And the larger tiers do not start from scratch: the medium starts from the trained small made
# twice as wide, the large from the trained medium made 3.5x as deep (growth.py), so each begins
# where the tier below ended and spends its budget going further with more parameters.
# Fixed step counts make a run repeatable step for step, whatever else the machine is doing.
# The small's steps are the cheapest of the family, so it lays the arithmetic down for the tiers
# grown from it: half its steps are complex orders and drills, 30% simple requests (its job, in
# every wording the rewording makes: 600 steps, more than the 540 of a 1,200-step run at 45%).
# Given only a quarter of 1,200 steps for arithmetic, the small passed on so little that the
# large grown through the medium ended at 23% on complex orders; with half of 2,000, at 76%
# (99% once the working wrote each sum's carries before its result).
# The medium spends more on medium requests and complex orders. The large inherits simple and
# medium requests from the medium and spends about two steps in three on complex orders, the
# class only it is meant to get right, and one in five on medium requests, whose held-out
# wordings it must answer.
SHORT_BUDGET_MIX = (0.15, 0.3, 0.4, 0.15)
SMALL_MIX = (0.3, 0.2, 0.35, 0.15)
LARGE_MIX = (0.05, 0.2, 0.65, 0.1)
RECIPES = {
    "small": TierRecipe(
        "small",
        n_layer=2,
        n_embd=192,
        n_head=4,
        lr=3e-3,
        budget_share=7 / 51,
        steps=2000,
        step_mix=SMALL_MIX,
    ),
    "medium": TierRecipe(
        "medium",
        n_layer=2,
        n_embd=384,
        n_head=8,
        lr=1e-3,
        budget_share=8 / 51,
        steps=1100,
        warmup_steps=100,
        step_mix=SHORT_BUDGET_MIX,
        grow_from="small",
    ),
    "large": TierRecipe(
        "large",
        n_layer=7,
        n_embd=384,
        n_head=8,
        lr=1e-3,
        budget_share=36 / 51,
        steps=1800,
        warmup_steps=100,
        step_mix=LARGE_MIX,
        grow_from="medium",
    ),
}
