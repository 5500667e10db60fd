"""`tiermesh route explain`: why a routing policy sends one prompt to the tier it does. The
policy's own decision (tier, score, reason), for the policies that read the complexity
predictor what the predictor saw (its class probabilities and the hashed n-grams of this prompt
that move its score most, with their weights), and the router's plan for the prompt as a
PROGRESSIVE chat under its gate.

Pure: a policy, its predictor and a prompt in, an Explanation out. The tiers' loads are taken
as idle (the router exposes no load RPC to read them from); a busy large tier can move a request
scored for large to medium (`large_queue_limit`), which an explanation names but does not apply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tiermesh.v1 import router_pb2

from services.common.config import RouterConfig
from services.common.tiers import TIER_NAMES
from services.router.adaptive_policy import AdaptivePolicy
from services.router.chat_planning import check_chat_request, plan_chat
from services.router.complexity_model import LEVELS, ComplexityModel, gram_index, grams
from services.router.fallback import never_down
from services.router.policy import RouteChoice, RoutingInput, RoutingPolicy
from services.router.static_policies import ThresholdPolicy

LOADS_ASSUMED = "idle (not read: the router has no load RPC)"


@dataclass(frozen=True)
class FeatureWeight:
    """One hashed feature of the prompt and what it does to the predictor's score."""

    grams: tuple[str, ...]  # the prompt's n-grams hashed into it ("w:six", "b:six white")
    index: int  # the hashed feature
    value: float  # its value in the prompt's L2-normalised vector
    weights: dict[str, float]  # the predictor's weight on it per class (tier)
    effect: float  # the score with it minus the score without it


@dataclass(frozen=True)
class PredictorView:
    """The complexity predictor's reading of the prompt."""

    score: float  # expected level of the cheapest correct tier, in [0, 1]
    probabilities: dict[str, float]  # P(cheapest correct tier = t)
    features: tuple[FeatureWeight, ...]  # the strongest first, by |effect|
    feature_count: int  # hashed features the prompt sets


@dataclass(frozen=True)
class ProgressiveView:
    """What the router plans for the prompt as a PROGRESSIVE chat, loads idle."""

    gate: str  # the router's progressive gate
    tiers: tuple[str, ...]  # the tiers its revisions may come from, in order
    reason: str  # the route decision's reason


@dataclass(frozen=True)
class Explanation:
    prompt: str
    policy: str
    tier: str  # the tier the policy routes the prompt to, loads idle
    complexity: float  # the policy's score (the predictor's, or the heuristic's)
    reason: str  # the policy's own words
    thresholds: dict[str, float] | None  # small_below, medium_below; None: the policy has none
    predictor: PredictorView | None  # None: the policy does not read the predictor
    loads: str  # which loads the decision assumed
    large_queue_limit: int | None  # past it a request scored for large may go to medium
    progressive: ProgressiveView | None = None  # the same prompt as a PROGRESSIVE chat

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def predictor_view(model: ComplexityModel, text: str, top: int = 8) -> PredictorView:
    """The predictor's probabilities and score for `text`, and its `top` features by the size
    of their effect on the score (the score with the feature minus the score without it)."""
    found: dict[int, list[str]] = {}
    for gram in grams(text):
        found.setdefault(gram_index(gram), []).append(gram)
    counts = {index: float(len(names)) for index, names in found.items()}
    norm = float(np.sqrt(sum(c * c for c in counts.values()))) or 1.0
    index = np.fromiter(counts, dtype=np.int64, count=len(counts))
    values = np.fromiter(counts.values(), dtype=np.float64, count=len(counts)) / norm
    parts = model.weights[:, index] * values  # (3, F): each feature's share of each logit
    logits = parts.sum(axis=1) + model.bias  # (3,)
    score = _score(logits)
    rows = [
        FeatureWeight(
            grams=tuple(dict.fromkeys(found[int(feature)])),
            index=int(feature),
            value=round(float(values[k]), 4),
            weights={
                t: round(float(w), 4)
                for t, w in zip(TIER_NAMES, model.weights[:, feature], strict=True)
            },
            effect=round(score - _score(logits - parts[:, k]), 4),
        )
        for k, feature in enumerate(index)
    ]
    rows.sort(key=lambda row: abs(row.effect), reverse=True)
    probabilities = _softmax(logits)
    return PredictorView(
        score=round(score, 4),
        probabilities={
            t: round(float(p), 4) for t, p in zip(TIER_NAMES, probabilities, strict=True)
        },
        features=tuple(rows[:top]),
        feature_count=len(rows),
    )


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max())
    probabilities: np.ndarray = exp / exp.sum()
    return probabilities


def _score(logits: np.ndarray) -> float:
    return float(_softmax(logits) @ LEVELS)


def predictor_of(policy: RoutingPolicy) -> ComplexityModel | None:
    """The complexity predictor the policy routes by, if any."""
    if isinstance(policy, ThresholdPolicy | AdaptivePolicy):
        return policy.model
    return None


def progressive_view(config: RouterConfig, choice: RouteChoice, prompt: str) -> ProgressiveView:
    """The router's own plan (chat_planning.plan_chat) of `prompt` as a PROGRESSIVE chat under
    its configured gate, with every tier idle and up, given the policy's `choice`."""
    request = router_pb2.ChatRequest(prompt=prompt, mode=router_pb2.MODE_PROGRESSIVE)
    plan = plan_chat(check_chat_request(request, config), config, {}, never_down, choice)
    return ProgressiveView(config.progressive_gate, plan.tiers, plan.decision.reason)


def explain(
    policy: RoutingPolicy,
    prompt: str,
    max_tokens: int = 200,
    top: int = 8,
    config: RouterConfig | None = None,
) -> Explanation:
    """The policy's decision on `prompt` with idle tiers, and what it rests on; with the
    router's `config`, also its plan for the prompt as a PROGRESSIVE chat."""
    choice = policy.route(RoutingInput((("user", prompt),), max_tokens), {})
    thresholds = getattr(policy, "thresholds", None)
    model = predictor_of(policy)
    return Explanation(
        prompt=prompt,
        policy=choice.policy,
        tier=choice.tier,
        complexity=round(choice.complexity, 4),
        reason=choice.reason,
        thresholds=(
            None
            if thresholds is None
            else {"small_below": thresholds[0], "medium_below": thresholds[1]}
        ),
        predictor=None if model is None else predictor_view(model, prompt, top),
        loads=LOADS_ASSUMED,
        large_queue_limit=getattr(policy, "large_queue_limit", None),
        progressive=None if config is None else progressive_view(config, choice, prompt),
    )
