"""`tiermesh route-eval`: every routing policy and the references (always small, always large,
random, oracle) on a split's measured outcomes: accuracy, cost, share per tier, misroute rate,
p99 routing latency; the threshold sweep; and the adaptive policy's learning curve from a cold
start on a feedback stream. Offline: no servers, no models.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from services.common.config import RouterConfig
from services.common.extras import require_extra
from services.common.tiers import TIER_NAMES
from services.router.adaptive_policy import AdaptivePolicy
from services.router.chat_planning import escalation_of
from services.router.complexity_model import ComplexityModel
from services.router.policy import InterimHeuristicPolicy, RoutingInput, RoutingPolicy
from services.router.static_policies import CostTargetPolicy, KeywordPolicy, ThresholdPolicy
from services.routing.cascade import (
    COST,
    QUALITY,
    cascade_per_request,
    escalation_per_request,
    first_tier_p99_ms,
    tune_cascade,
)
from services.routing.intervals import CONFIDENCE, RESAMPLES, PerRequest, Resampler
from services.routing.outcomes import Outcome
from services.routing.simulation import RoutingResult, evaluate_choices, oracle_choice


def _route_all(policy: RoutingPolicy, outcomes: Sequence[Outcome]) -> tuple[list[str], float]:
    """The policy's tier per request, and its p99 routing latency in ms."""
    choices, samples = [], []
    for outcome in outcomes:
        request = RoutingInput((("user", outcome.prompt),), 128)
        start = time.perf_counter()
        choices.append(policy.route(request, {}).tier)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return choices, samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def mean_reward(result: RoutingResult, costs: dict[str, float], cost_weight: float) -> float:
    """Quality minus cost_weight x the tier's relative price, averaged: the bandit's reward."""
    price = sum(result.share[t] * costs[t] for t in TIER_NAMES)
    return result.accuracy - cost_weight * price


def learning_curve(
    model: ComplexityModel,
    feedback: Sequence[Outcome],
    evaluation: Sequence[Outcome],
    costs: dict[str, float],
    cost_weight: float,
    steps: int,
    every: int,
    seed: int,
) -> tuple[AdaptivePolicy, list[dict[str, float]]]:
    """Trains `adaptive` from cold on `steps` feedback requests (drawn from `feedback`,
    rewarded by the chosen tier's measured correctness) and evaluates it every `every`."""
    policy = AdaptivePolicy(model, costs, cost_weight=cost_weight)
    rng = random.Random(seed)
    curve = []
    for step in range(steps + 1):
        if step % every == 0:
            saved, policy._alpha = policy._alpha, 0.0  # evaluate without exploration
            choices, _ = _route_all(policy, evaluation)
            policy._alpha = saved
            result = evaluate_choices(evaluation, choices, costs)
            curve.append(
                {
                    "feedback": step,
                    "accuracy": round(result.accuracy, 4),
                    "cost": round(result.cost, 4),
                    "reward": round(mean_reward(result, costs, cost_weight), 4),
                }
            )
        if step == steps:
            break
        outcome = feedback[rng.randrange(len(feedback))]
        choice = policy.route(RoutingInput((("user", outcome.prompt),), 128), {})
        policy.learn(choice, choice.tier, 1.0 if outcome.tiers[choice.tier].correct else 0.0)
    return policy, curve


def _reward(point: dict[str, float]) -> float:
    return point["reward"]


def threshold_sweep(
    model: ComplexityModel, outcomes: Sequence[Outcome], costs: dict[str, float], cost_weight: float
) -> list[dict[str, float]]:
    scores = np.array([model.score(o.prompt) for o in outcomes])
    points = []
    for small_below in np.round(np.arange(0.0, 1.01, 0.05), 3):
        for medium_below in np.round(np.arange(small_below, 1.01, 0.05), 3):
            choices = np.where(
                scores < small_below, "small", np.where(scores < medium_below, "medium", "large")
            )
            result = evaluate_choices(outcomes, list(choices), costs)
            points.append(
                {
                    "small_below": float(small_below),
                    "medium_below": float(medium_below),
                    "accuracy": round(result.accuracy, 4),
                    "cost": round(result.cost, 4),
                    "reward": round(mean_reward(result, costs, cost_weight), 4),
                }
            )
    return points


def route_eval(
    outcomes: Sequence[Outcome],
    feedback: Sequence[Outcome],
    model: ComplexityModel,
    costs: dict[str, float],
    cost_weight: float = 0.3,
    feedback_steps: int = 3000,
    seed: int = 0,
    tuning: Sequence[Outcome] | None = None,
) -> dict[str, Any]:
    """The report `tiermesh route-eval` prints. `tuning` (dev) picks the static threshold a
    deployment could choose in advance: the sweep point with the best reward there, scored on
    `outcomes`; the best sweep point on `outcomes` itself is reported too (hindsight)."""
    adaptive, curve = learning_curve(
        model, feedback, outcomes, costs, cost_weight, feedback_steps, 250, seed
    )
    adaptive._alpha = 0.0
    policies: dict[str, RoutingPolicy] = {
        "keyword": KeywordPolicy(),
        "interim_heuristic": InterimHeuristicPolicy(),
        "threshold": ThresholdPolicy(model),
        "cost_target": CostTargetPolicy(model),
        "adaptive": adaptive,
    }
    large = evaluate_choices(outcomes, ["large"] * len(outcomes), costs)
    resampler = Resampler(outcomes, seed)
    large_each = PerRequest.of(outcomes, ["large"] * len(outcomes), costs)

    def with_intervals(
        row: dict[str, Any], choices: Sequence[str], each: PerRequest | None = None
    ) -> dict[str, Any]:
        """The row with its confidence intervals, overall, per phrasing and per class."""
        each = each or PerRequest.of(outcomes, choices, costs)
        spread = resampler.report(each, large_each)
        row |= spread["overall"]
        row["by_phrasing"] = {
            phrasing: figures | spread["phrasing"][phrasing]
            for phrasing, figures in group_figures(outcomes, each, "phrasing").items()
        }
        row["by_class"] = {
            name: figures | spread["class"][name]
            for name, figures in group_figures(outcomes, each, "request_class").items()
        }
        return row

    rows = []
    for name, policy in policies.items():
        choices, p99_ms = _route_all(policy, outcomes)
        result = evaluate_choices(outcomes, choices, costs)
        rows.append(with_intervals(_row(name, result, large, costs, cost_weight, p99_ms), choices))
    rng = random.Random(seed)
    reference_choices = {
        "always_small": ["small"] * len(outcomes),
        "always_large": ["large"] * len(outcomes),
        "random": [rng.choice(TIER_NAMES) for _ in outcomes],
        "oracle": [oracle_choice(o) for o in outcomes],
    }
    references = {
        name: with_intervals(
            _row(name, evaluate_choices(outcomes, choices, costs), large, costs, cost_weight, 0.0),
            choices,
        )
        for name, choices in reference_choices.items()
    }
    sweep = threshold_sweep(model, outcomes, costs, cost_weight)
    best_static = max(sweep, key=_reward)
    static_dev = best_static
    if tuning is not None:  # the same grid in the same order, scored on the tuning split
        tuned = threshold_sweep(model, tuning, costs, cost_weight)
        static_dev = sweep[max(range(len(tuned)), key=lambda i: tuned[i]["reward"])]
    report: dict[str, Any] = {
        "requests": len(outcomes),
        "bootstrap": {"resamples": RESAMPLES, "confidence": CONFIDENCE, "seed": seed},
        "costs": costs,
        "cost_weight": cost_weight,
        "policies": rows,
        "references": references,
        "threshold_sweep": sweep,
        "best_static_threshold": best_static,
        "static_threshold_tuned_on_dev": static_dev,
        "adaptive_learning_curve": curve,
    }

    def every_tier_paid(
        name: str, tiers: list[str], each: PerRequest, p99_ms: float
    ) -> dict[str, Any]:
        """The row of a policy that may run several tiers per request (each one paid)."""
        result = RoutingResult(
            accuracy=float(each.correct.mean()),
            cost=float(each.cost.mean()),
            share=evaluate_choices(outcomes, tiers, costs).share,
            misroute_rate=float((each.too_small + each.too_big).mean()),
        )
        return with_intervals(_row(name, result, large, costs, cost_weight, p99_ms), tiers, each)

    # the router's gate as it ships (RouterConfig's escalate thresholds), by its own decision
    shipped = escalation_of(RouterConfig())
    escalated = escalation_per_request(outcomes, model, costs, shipped)
    p99_ms = first_tier_p99_ms(outcomes, model, shipped)
    report["escalate"] = every_tier_paid("escalate", *escalated, p99_ms) | {
        "thresholds": asdict(shipped)
    }
    if tuning is not None:
        cascade = tune_cascade(model, tuning, costs)
        report["cascade"] = every_tier_paid(
            "cascade", *cascade_per_request(outcomes, model, costs, cascade), p99_ms
        ) | {
            "tuned_on_dev": cascade.__dict__,
            "target": {"quality_vs_large": QUALITY, "cost_vs_large": COST},
        }
    return report


def by_group(
    outcomes: Sequence[Outcome], choices: Sequence[str], costs: dict[str, float], attribute: str
) -> dict[str, dict[str, float]]:
    """Requests, accuracy, cost and misroute rate of the same choices on each group of the
    split apart: `attribute` "phrasing" (seen, unseen) or "request_class"."""
    return group_figures(outcomes, PerRequest.of(outcomes, choices, costs), attribute)


def group_figures(
    outcomes: Sequence[Outcome], each: PerRequest, attribute: str
) -> dict[str, dict[str, float]]:
    """by_group from per-request figures (a cascade's cost counts every tier it ran)."""
    report = {}
    for group in dict.fromkeys(getattr(o, attribute) for o in outcomes):
        at = np.asarray([i for i, o in enumerate(outcomes) if getattr(o, attribute) == group])
        report[group] = {
            "requests": len(at),
            "accuracy": round(float(each.correct[at].mean()), 4),
            "cost": round(float(each.cost[at].mean()), 4),
            "misroute_rate": round(float((each.too_small[at] + each.too_big[at]).mean()), 4),
        }
    return report


def by_phrasing(
    outcomes: Sequence[Outcome], choices: Sequence[str], costs: dict[str, float]
) -> dict[str, dict[str, float]]:
    """Requests, accuracy and cost of the same choices on seen and on unseen phrasings apart."""
    groups = by_group(outcomes, choices, costs, "phrasing")
    keep = ("requests", "accuracy", "cost")
    return {name: {k: figures[k] for k in keep} for name, figures in groups.items()}


def _row(
    name: str,
    result: RoutingResult,
    large: RoutingResult,
    costs: dict[str, float],
    cost_weight: float,
    p99_ms: float,
) -> dict[str, Any]:
    return {
        "name": name,
        **result.to_json(),
        "quality_vs_large": round(result.accuracy / large.accuracy, 4) if large.accuracy else 0.0,
        "cost_vs_large": round(result.cost / large.cost, 4) if large.cost else 0.0,
        "reward": round(mean_reward(result, costs, cost_weight), 4),
        "p99_route_ms": round(p99_ms, 4),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """Cost vs quality (policies as points, the threshold sweep as a curve) and the adaptive
    learning curve, in one PNG."""
    require_extra("matplotlib", "route-eval's plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    sweep = sorted(report["threshold_sweep"], key=lambda p: p["cost"])
    frontier, best = [], -1.0
    for point in sweep:
        if point["accuracy"] > best:
            frontier.append(point)
            best = point["accuracy"]
    left.plot(
        [p["cost"] for p in frontier],
        [p["accuracy"] for p in frontier],
        "-",
        label="threshold sweep",
    )
    for row in report["policies"]:
        left.scatter(row["cost"], row["accuracy"], marker="o")
        left.annotate(row["name"], (row["cost"], row["accuracy"]), fontsize=8)
    for name, row in report["references"].items():
        left.scatter(row["cost"], row["accuracy"], marker="x", color="grey")
        left.annotate(name, (row["cost"], row["accuracy"]), fontsize=8, color="grey")
    left.set_xlabel("cost per request (relative price x output tokens)")
    left.set_ylabel("accuracy")
    left.set_title("cost vs quality")
    left.legend(loc="lower right")
    curve = report["adaptive_learning_curve"]
    right.plot([p["feedback"] for p in curve], [p["reward"] for p in curve], label="adaptive")
    right.axhline(
        report["best_static_threshold"]["reward"],
        linestyle="--",
        color="grey",
        label="best static threshold (hindsight)",
    )
    right.axhline(
        report["static_threshold_tuned_on_dev"]["reward"],
        linestyle=":",
        color="black",
        label="static threshold tuned on dev",
    )
    right.set_xlabel("requests of feedback")
    right.set_ylabel(f"reward (quality - {report['cost_weight']} x price)")
    right.set_title("adaptive routing from a cold start")
    right.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
