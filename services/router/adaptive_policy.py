"""`adaptive`: routing learned online, a discounted LinUCB contextual bandit over the tiers.

Context: the complexity model's class probabilities and score, three shape features the score
folds away (how many numbers the request carries, its length, whether it names a quantity in
words) and a bias term. Reward of a decision: quality in [0, 1] minus lambda x the tier's
relative cost. It learns from Feedback RPCs and from progressive refinements (a draft the
refinement changed was the wrong call). Each reward fades by the forgetting factor per later
reward, so the estimates follow the traffic as it is now and an arm left untried regains its
uncertainty: exploration never dies out. State lives in this router process only; several
routers learn separately. Not thread-safe: used from the router's event loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from services.common.tiers import TIER_NAMES
from services.router.complexity_model import ComplexityModel
from services.router.policy import Loads, RouteChoice, RoutingInput

CONTEXT_DIMS = 8  # bias, 3 class probabilities, score, numbers, length, quantity in words
SCORE_INDEX = 4  # where the complexity score sits in the context
NUMBER = re.compile(r"\d+")
# a quantity spelled out ("six white belts"): the predictor's n-grams see a word it may never
# have met in that place, where a digit would have been
QUANTITY_WORD = re.compile(
    r"\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)\b", re.IGNORECASE
)


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
        # weight of the past per reward, in (0, 1]: about 1 / (1 - forgetting) recent rewards
        # count (2,000 at 0.9995); 1.0 weighs every reward alike, and after a change of traffic
        # mix the old mix outvoted the new for as long as it had lasted (route-eval --drift)
        forgetting: float = 0.9995,
    ) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError(f"forgetting: must be in (0, 1], got {forgetting}")
        self._model = model
        self._costs = dict(costs)
        self._lambda = cost_weight
        self._alpha = exploration
        self._tiers = tiers
        self._forgetting = forgetting
        dims = CONTEXT_DIMS
        # per tier: the ridge design matrix (prior: identity), its inverse, the rewarded contexts
        self._a: dict[str, np.ndarray] = {t: np.eye(dims) for t in tiers}
        self._a_inv: dict[str, np.ndarray] = {t: np.eye(dims) for t in tiers}
        self._b: dict[str, np.ndarray] = {t: np.zeros(dims) for t in tiers}
        self.updates = 0

    @property
    def model(self) -> ComplexityModel:
        """The complexity predictor whose reading is part of its context."""
        return self._model

    def context(self, text: str) -> np.ndarray:
        probs = self._model.probabilities(text)
        numbers = min(1.0, len(NUMBER.findall(text)) / 8)
        length = min(1.0, len(text) / 400)
        in_words = 1.0 if QUANTITY_WORD.search(text) else 0.0
        score = float(probs @ [0.0, 0.5, 1.0])
        return np.array([1.0, *probs, score, numbers, length, in_words])

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
        """Discounted update: every arm's statistics fade by the forgetting factor toward the
        identity prior (so none becomes singular), then `tier`'s takes the reward. Three 8 x 8
        inversions, off the routing path."""
        if tier not in self._a_inv or len(choice.context) != CONTEXT_DIMS:
            return
        x = np.array(choice.context)
        reward = quality - self._lambda * self._costs.get(tier, 0.0)
        gamma = self._forgetting
        prior = (1.0 - gamma) * np.eye(CONTEXT_DIMS)
        for arm in self._tiers:
            a, b = gamma * self._a[arm] + prior, gamma * self._b[arm]
            if arm == tier:
                a, b = a + np.outer(x, x), b + reward * x
            self._a[arm], self._b[arm] = a, b
            self._a_inv[arm] = np.linalg.inv(a)
        self.updates += 1
