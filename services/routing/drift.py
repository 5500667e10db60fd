"""`tiermesh route-eval --drift`: routing when the traffic changes. A seeded stream drawn from a
split's measured outcomes switches its request mix at `change_at` (more complex orders, and
wordings the predictor never trained on); every policy routes it in order and learns from each
request's outcome as the router's Feedback would give it, and is scored on the requests after
the change against the best static threshold for the new mix in hindsight.

Offline and pure: no servers, no clock; the same seed gives the same stream and report.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.router.adaptive_policy import AdaptivePolicy
from services.router.complexity_model import ComplexityModel
from services.router.policy import InterimHeuristicPolicy, RoutingInput, RoutingPolicy
from services.router.static_policies import CostTargetPolicy, KeywordPolicy, ThresholdPolicy
from services.routing.intervals import CONFIDENCE, RESAMPLES, PerRequest, Resampler, bounds
from services.routing.outcomes import Outcome
from services.routing.route_eval import mean_reward, threshold_sweep
from services.routing.simulation import evaluate_choices

Mix = Mapping[str, float]  # "class/phrasing" (e.g. "medium/unseen") -> share of the requests
# Before: the seen wordings, one request in ten a complex order. After: four in ten complex
# orders, and three in ten medium requests in held-out wordings the predictor never saw.
BEFORE_MIX: Mix = {"simple/seen": 0.8, "medium/seen": 0.1, "complex/seen": 0.1}
AFTER_MIX: Mix = {"simple/seen": 0.3, "medium/unseen": 0.3, "complex/seen": 0.4}
BEFORE_REQUESTS = 3000  # long enough for a learning policy to settle on the old mix
AFTER_REQUESTS = 1000  # the requests scored after the change


@dataclass(frozen=True)
class DriftStream:
    """The requests in arrival order; the mix changes at position `change_at`."""

    requests: tuple[Outcome, ...]
    change_at: int
    before_mix: Mix
    after_mix: Mix

    @property
    def before(self) -> tuple[Outcome, ...]:
        return self.requests[: self.change_at]

    @property
    def after(self) -> tuple[Outcome, ...]:
        return self.requests[self.change_at :]


def group_key(outcome: Outcome) -> str:
    return f"{outcome.request_class}/{outcome.phrasing}"


def group_counts(mix: Mix, total: int) -> dict[str, int]:
    """Requests per group for `total` requests in the mix's proportions (largest remainder, ties
    in the mix's order), summing to `total` exactly."""
    weight = sum(mix.values())
    if weight <= 0 or any(share < 0 for share in mix.values()):
        raise ValueError(f"mix: shares must be >= 0 and sum to more than 0, got {dict(mix)}")
    exact = {group: total * share / weight for group, share in mix.items()}
    counts = {group: int(value) for group, value in exact.items()}
    by_remainder = sorted(exact, key=lambda g: exact[g] - counts[g], reverse=True)
    for group in by_remainder[: total - sum(counts.values())]:
        counts[group] += 1
    return counts


def _draw(
    groups: Mapping[str, Sequence[Outcome]], mix: Mix, total: int, rng: random.Random
) -> list[Outcome]:
    """`total` requests in the mix's exact proportions, each group resampled with replacement,
    shuffled."""
    drawn: list[Outcome] = []
    for group, count in group_counts(mix, total).items():
        pool = groups.get(group, ())
        if count and not pool:
            raise ValueError(f"mix: no {group!r} requests in the split (have {sorted(groups)})")
        drawn += [pool[rng.randrange(len(pool))] for _ in range(count)]
    rng.shuffle(drawn)
    return drawn


def drift_stream(
    outcomes: Sequence[Outcome],
    before_mix: Mix = BEFORE_MIX,
    after_mix: Mix = AFTER_MIX,
    before: int = BEFORE_REQUESTS,
    after: int = AFTER_REQUESTS,
    seed: int = 0,
) -> DriftStream:
    """`before` requests in `before_mix`, then `after` in `after_mix`, drawn from `outcomes`
    (a split's measured outcomes) with a seeded generator."""
    groups: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault(group_key(outcome), []).append(outcome)
    rng = random.Random(seed)
    requests = _draw(groups, before_mix, before, rng) + _draw(groups, after_mix, after, rng)
    return DriftStream(tuple(requests), before, dict(before_mix), dict(after_mix))


def replay(policy: RoutingPolicy, requests: Sequence[Outcome]) -> list[str]:
    """Routes the requests in order (tiers idle); after each, the policy learns the chosen
    tier's measured correctness, as a Feedback of 1.0 or 0.0 on that request would teach it."""
    choices = []
    for outcome in requests:
        choice = policy.route(RoutingInput((("user", outcome.prompt),), 128), {})
        policy.learn(choice, choice.tier, 1.0 if outcome.tiers[choice.tier].correct else 0.0)
        choices.append(choice.tier)
    return choices


def _best_static(
    model: ComplexityModel, requests: Sequence[Outcome], costs: dict[str, float], weight: float
) -> dict[str, float]:
    """The sweep's thresholds with the best reward on `requests` (hindsight)."""
    return max(threshold_sweep(model, requests, costs, weight), key=lambda p: p["reward"])


def _static(model: ComplexityModel, point: Mapping[str, float]) -> ThresholdPolicy:
    return ThresholdPolicy(model, point["small_below"], point["medium_below"])


PolicyMaker = Callable[[], RoutingPolicy]


def drift_policies(
    model: ComplexityModel,
    costs: dict[str, float],
    cost_weight: float,
    tuned_before: Mapping[str, float],
) -> dict[str, PolicyMaker]:
    """Every policy of the replay, built fresh (the adaptive one cold) for each stream."""
    return {
        "keyword": KeywordPolicy,
        "interim_heuristic": InterimHeuristicPolicy,
        "threshold": lambda: ThresholdPolicy(model),
        "cost_target": lambda: CostTargetPolicy(model),
        "static_tuned_before": lambda: _static(model, tuned_before),
        "adaptive": lambda: AdaptivePolicy(model, costs, cost_weight=cost_weight),
    }


def _segment_row(
    after: Sequence[Outcome],
    choices: Sequence[str],
    costs: dict[str, float],
    cost_weight: float,
    resampler: Resampler,
    large: PerRequest,
    best: np.ndarray,
) -> dict[str, Any]:
    """Accuracy, cost, reward and misroutes of the choices on the requests after the change,
    with 95% intervals; `reward_vs_best_static` is the paired gap to the hindsight threshold's
    per-request rewards `best`."""
    result = evaluate_choices(after, choices, costs)
    each = PerRequest.of(after, choices, costs)
    reward = _rewards(each, choices, costs, cost_weight)
    spread = resampler.report(each, large)["overall"]
    keep = ("accuracy_ci95", "cost_ci95", "misroute_rate_ci95", "cost_vs_large_ci95")
    gap = reward - best
    large_cost = float(large.cost.mean())
    return {
        **result.to_json(),
        "cost_vs_large": round(result.cost / large_cost, 4) if large_cost else 0.0,
        "reward": round(mean_reward(result, costs, cost_weight), 4),
        **{field: spread[field] for field in keep},
        "reward_ci95": bounds(reward[resampler.all].mean(axis=1)),
        "reward_vs_best_static": round(float(gap.mean()), 4),
        "reward_vs_best_static_ci95": bounds(gap[resampler.all].mean(axis=1)),
    }


def _rewards(
    each: PerRequest, choices: Sequence[str], costs: dict[str, float], cost_weight: float
) -> np.ndarray:
    """Per request: quality (1 or 0) - cost_weight x the chosen tier's relative price."""
    price = np.array([costs[t] for t in choices])
    rewards: np.ndarray = each.correct - cost_weight * price
    return rewards


def _windows(
    requests: Sequence[Outcome],
    choices: Sequence[str],
    costs: dict[str, float],
    cost_weight: float,
    size: int,
) -> list[float]:
    """Mean reward in consecutive windows of `size` requests over the whole stream."""
    rewards = _rewards(PerRequest.of(requests, choices, costs), choices, costs, cost_weight)
    return [round(float(rewards[i : i + size].mean()), 4) for i in range(0, len(rewards), size)]


def drift_eval(
    outcomes: Sequence[Outcome],
    model: ComplexityModel,
    costs: dict[str, float],
    cost_weight: float = 0.3,
    seed: int = 0,
    before_mix: Mix = BEFORE_MIX,
    after_mix: Mix = AFTER_MIX,
    before: int = BEFORE_REQUESTS,
    after: int = AFTER_REQUESTS,
    window: int = 250,
    policies: Mapping[str, PolicyMaker] | None = None,
) -> dict[str, Any]:
    """The report `tiermesh route-eval --drift` prints (its `drift` object)."""
    stream = drift_stream(outcomes, before_mix, after_mix, before, after, seed)
    tuned_before = _best_static(model, stream.before, costs, cost_weight)
    best_after = _best_static(model, stream.after, costs, cost_weight)
    makers = policies or drift_policies(model, costs, cost_weight, tuned_before)
    resampler = Resampler(stream.after, seed)
    large = PerRequest.of(stream.after, ["large"] * after, costs)
    best_choices = replay(_static(model, best_after), stream.after)
    best_each = PerRequest.of(stream.after, best_choices, costs)
    best = _rewards(best_each, best_choices, costs, cost_weight)
    rows = []
    for name, make in makers.items():
        choices = replay(make(), stream.requests)
        after_choices = choices[stream.change_at :]
        before_result = evaluate_choices(stream.before, choices[: stream.change_at], costs)
        rows.append(
            {
                "name": name,
                "after": _segment_row(
                    stream.after, after_choices, costs, cost_weight, resampler, large, best
                ),
                "before": {
                    "accuracy": round(before_result.accuracy, 4),
                    "cost": round(before_result.cost, 4),
                    "reward": round(mean_reward(before_result, costs, cost_weight), 4),
                },
                "reward_windows": _windows(stream.requests, choices, costs, cost_weight, window),
            }
        )
    best_row = _segment_row(stream.after, best_choices, costs, cost_weight, resampler, large, best)
    return {
        "drift": {
            "seed": seed,
            "requests": len(stream.requests),
            "change_at": stream.change_at,
            "before_mix": dict(before_mix),
            "after_mix": dict(after_mix),
            "costs": costs,
            "cost_weight": cost_weight,
            "bootstrap": {"resamples": RESAMPLES, "confidence": CONFIDENCE, "seed": seed},
            "window": window,
            "policies": rows,
            "best_static_after": {**_thresholds(best_after), **best_row},
            "static_tuned_before": _thresholds(tuned_before),
        }
    }


def _thresholds(point: Mapping[str, float]) -> dict[str, float]:
    return {"small_below": point["small_below"], "medium_below": point["medium_below"]}
