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
    batch_tokens: int = 2048  # padded tokens per optimiser step (rows = batch_tokens // length)
    warmup_steps: int = 50
    weight_decay: float = 0.01
    n_positions: int = 256  # longest prompt + answer the model can see


RECIPES = {
    "small": TierRecipe(
        "small", n_layer=2, n_embd=192, n_head=4, lr=3e-3, budget_share=12 / 52, batch_tokens=4096
    ),
    "medium": TierRecipe("medium", n_layer=6, n_embd=256, n_head=8, lr=2e-3, budget_share=32 / 52),
    "large": TierRecipe("large", n_layer=7, n_embd=384, n_head=8, lr=1.5e-3, budget_share=1.0),
}
