"""95% bootstrap confidence intervals of a routing policy's figures on a split: accuracy, cost,
quality and cost against always-large, and the misroute rate, split into too small (the tier
failed where a costlier one answers) and too big (costlier than the cheapest correct tier).

Requests are resampled with replacement RESAMPLES times from a seeded generator; every policy is
scored on the same resamples (paired), so two policies' intervals compare like with like, and a
ratio against always-large is taken within each resample. A group (a phrasing, a request class)
is resampled within itself. `ratio_ci95` is the same bootstrap for any paired share or ratio of
shares (the bench's accuracy and quality against its baseline). Pure numpy over outcome records:
no servers, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from services.common.tiers import TIER_NAMES

RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 0


class TierAnswer(Protocol):
    @property
    def correct(self) -> bool: ...
    @property
    def tokens(self) -> int: ...


class Outcome(Protocol):
    """What the intervals read of a measured request (outcomes.Outcome, named here by shape
    so the bench can use this module without the labelling code outcomes.py brings)."""

    @property
    def tiers(self) -> Mapping[str, TierAnswer]: ...
    @property
    def label(self) -> str: ...
    @property
    def phrasing(self) -> str: ...
    @property
    def request_class(self) -> str: ...


@dataclass(frozen=True)
class PerRequest:
    """One policy's choices as per-request numbers (arrays of the split's length)."""

    correct: np.ndarray  # 1.0 where the chosen tier answered correctly
    cost: np.ndarray  # tier price x output tokens
    too_small: np.ndarray  # 1.0 where it failed while a costlier tier answers correctly
    too_big: np.ndarray  # 1.0 where it answered but a cheaper tier would have

    @classmethod
    def of(
        cls, outcomes: Sequence[Outcome], choices: Sequence[str], costs: dict[str, float]
    ) -> PerRequest:
        correct, cost, small, big = [], [], [], []
        for outcome, tier in zip(outcomes, choices, strict=True):
            answered = outcome.tiers[tier].correct
            rank = TIER_NAMES.index(tier)
            above = [t for t in TIER_NAMES[rank + 1 :] if t in outcome.tiers]
            label = outcome.label
            correct.append(float(answered))
            cost.append(costs[tier] * outcome.tiers[tier].tokens)
            small.append(float(not answered and any(outcome.tiers[t].correct for t in above)))
            cheaper = label in TIER_NAMES and TIER_NAMES.index(label) < rank
            big.append(float(answered and cheaper))
        return cls(
            *(np.asarray(values, dtype=np.float64) for values in (correct, cost, small, big))
        )


def resamples(size: int, seed: int = SEED, count: int = RESAMPLES) -> np.ndarray:
    """(count, size) indices into a group of `size` requests, drawn with replacement."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, size, size=(count, size), dtype=np.int32)


def bounds(values: np.ndarray) -> list[float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return [round(float(low), 4), round(float(high), 4)]


def intervals(policy: PerRequest, large: PerRequest, index: np.ndarray) -> dict[str, Any]:
    """The `*_ci95` fields of one policy on the requests `index` resamples (rows of positions
    into the per-request arrays), with always-large's on the same resamples for the ratios."""
    accuracy = policy.correct[index].mean(axis=1)
    cost = policy.cost[index].mean(axis=1)
    large_accuracy = large.correct[index].mean(axis=1)
    large_cost = large.cost[index].mean(axis=1)
    too_small = policy.too_small[index].mean(axis=1)
    too_big = policy.too_big[index].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        quality = np.where(large_accuracy > 0, accuracy / large_accuracy, 0.0)
        cost_ratio = np.where(large_cost > 0, cost / large_cost, 0.0)
    return {
        "accuracy_ci95": bounds(accuracy),
        "cost_ci95": bounds(cost),
        "quality_vs_large_ci95": bounds(quality),
        "cost_vs_large_ci95": bounds(cost_ratio),
        "misroute_rate_ci95": bounds(too_small + too_big),
        "misroute_too_small_ci95": bounds(too_small),
        "misroute_too_big_ci95": bounds(too_big),
    }


def point_figures(policy: PerRequest, positions: np.ndarray) -> dict[str, float]:
    """The misroute split's point estimates on the requests at `positions`."""
    return {
        "misroute_too_small": round(float(policy.too_small[positions].mean()), 4),
        "misroute_too_big": round(float(policy.too_big[positions].mean()), 4),
    }


class Resampler:
    """The resamples of a split and of each of its groups, drawn once and shared by every
    policy (paired intervals)."""

    def __init__(self, outcomes: Sequence[Outcome], seed: int = SEED) -> None:
        self.size = len(outcomes)
        self.all = resamples(self.size, seed)
        self.groups: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        keys = [("phrasing", o.phrasing) for o in outcomes]
        keys += [("class", o.request_class) for o in outcomes]
        for n, (kind, name) in enumerate(dict.fromkeys(keys)):
            attribute = "phrasing" if kind == "phrasing" else "request_class"
            positions = np.asarray(
                [i for i, o in enumerate(outcomes) if getattr(o, attribute) == name], dtype=np.int32
            )
            drawn = resamples(len(positions), seed + 1 + n)
            self.groups[(kind, name)] = (positions, positions[drawn])

    def report(self, policy: PerRequest, large: PerRequest) -> dict[str, Any]:
        """The policy's intervals overall, with its misroute split; and per group."""
        everything = np.arange(self.size)
        overall = point_figures(policy, everything) | intervals(policy, large, self.all)
        groups: dict[str, dict[str, Any]] = {"phrasing": {}, "class": {}}
        for (kind, name), (positions, index) in self.groups.items():
            groups[kind][name] = point_figures(policy, positions) | intervals(policy, large, index)
        return {"overall": overall, **groups}


def ratio_ci95(
    scores: np.ndarray,
    counted: np.ndarray,
    base_scores: np.ndarray | None = None,
    base_counted: np.ndarray | None = None,
    seed: int = SEED,
) -> list[float] | None:
    """The 95% interval of sum(scores) / sum(counted) over the same requests, divided by the
    baseline's sum(base_scores) / sum(base_counted) when a baseline is given (arrays of equal
    length, one entry per request, paired). A resample whose denominator is zero is left out;
    None when every one is (or there are no requests)."""
    if len(scores) == 0:
        return None
    index = resamples(len(scores), seed)
    value = scores[index].sum(axis=1)
    total = counted[index].sum(axis=1)
    keep = total > 0
    if base_scores is not None and base_counted is not None:
        base_value = base_scores[index].sum(axis=1)
        base_total = base_counted[index].sum(axis=1)
        keep &= (base_total > 0) & (base_value > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = value * base_total / (total * base_value)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = value / total
    return bounds(ratio[keep]) if keep.any() else None
