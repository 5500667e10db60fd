"""`adaptive`: routing learned online, a LinUCB contextual bandit over the tiers.

Context: the complexity model's class probabilities and score, two shape features the score
folds away (how many numbers the request carries, its length) and a bias term. Reward of a
decision: quality in [0, 1] minus lambda x the tier's relative cost. It learns from Feedback
RPCs and from progressive refinements (a draft the refinement changed was the wrong call).
State lives in this router process only; several routers learn separately. Not thread-safe:
used from the router's event loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from services.common.tiers import TIER_NAMES
from services.router.complexity_model import ComplexityModel
from services.router.policy import Loads, RouteChoice, RoutingInput

CONTEXT_DIMS = 7  # bias, 3 class probabilities, score, numbers, length
SCORE_INDEX = 4  # where the complexity score sits in the context
NUMBER = re.compile(r"\d+")


class AdaptivePolicy:
    name = "adaptive"

    def __init__(
        self,
        model: ComplexityModel,
        costs: Mapping[str, float],
        cost_weight: float = 0.3,
        # the bonus must be able to outbid the gap between arms' rewards (up to 1 - lambda): at
        # 0.3 an arm that lost its first tries on hard requests was never tried on easy ones
        # again, and some feedback orders ended routing everything to large
        exploration: float = 1.0,
        tiers: tuple[str, ...] = TIER_NAMES,
    ) -> None:
        self._model = model
        self._costs = dict(costs)
        self._lambda = cost_weight
        self._alpha = exploration
        self._tiers = tiers
        dims = CONTEXT_DIMS
        self._a_inv = {t: np.eye(dims) for t in tiers}  # inverse of the ridge design matrix
        self._b = {t: np.zeros(dims) for t in tiers}
        self.updates = 0

    def context(self, text: str) -> np.ndarray:
        probs = self._model.probabilities(text)
        numbers = min(1.0, len(NUMBER.findall(text)) / 8)
        length = min(1.0, len(text) / 400)
        return np.array([1.0, *probs, float(probs @ [0.0, 0.5, 1.0]), numbers, length])

    def estimates(self, x: np.ndarray) -> dict[str, tuple[float, float]]:
        """Per tier: (expected reward, exploration bonus) for context x."""
        out = {}
        for tier in self._tiers:
            theta = self._a_inv[tier] @ self._b[tier]
            bonus = self._alpha * float(np.sqrt(x @ self._a_inv[tier] @ x))
            out[tier] = (float(theta @ x), bonus)
        return out

    def route(self, request: RoutingInput, loads: Loads) -> RouteChoice:
        x = self.context(request.user_text)
        estimates = self.estimates(x)
        tier = max(self._tiers, key=lambda t: sum(estimates[t]))
        detail = ", ".join(f"{t} {m:+.2f}±{b:.2f}" for t, (m, b) in estimates.items())
        reason = f"LinUCB after {self.updates} rewards: {detail}"
        return RouteChoice(
            tier, float(x[SCORE_INDEX]), self.name, reason, tuple(float(v) for v in x)
        )

    def learn(self, choice: RouteChoice, tier: str, quality: float) -> None:
        if tier not in self._a_inv or len(choice.context) != CONTEXT_DIMS:
            return
        x = np.array(choice.context)
        reward = quality - self._lambda * self._costs.get(tier, 0.0)
        a_inv = self._a_inv[tier]
        ax = a_inv @ x
        self._a_inv[tier] = a_inv - np.outer(ax, ax) / (1.0 + x @ ax)  # Sherman-Morrison
        self._b[tier] = self._b[tier] + reward * x
        self.updates += 1
