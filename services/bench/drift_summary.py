"""The numbers of `tiermesh bench --scenario drift`: the seeded request stream whose class mix
changes midway, and per policy its accuracy (with a 95% bootstrap interval), cost and tiers over
the requests before and after the change, accuracy in windows after it, and each policy against
the first one on the same requests.

Pure: request records and workload items in, plain data out; nothing of gRPC, processes or time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from services.bench.loadgen import RequestRecord
from services.bench.metrics import RequestScores, accuracy_ci95, quality_ci95, request_scores
from services.bench.scenarios import RequestSequence
from services.workload import WorkloadItem

# Before the change one request in ten is a complex order; after it four in ten are.
BEFORE_MIX: Mapping[str, float] = {"simple": 0.8, "medium": 0.1, "complex": 0.1}
AFTER_MIX: Mapping[str, float] = {"simple": 0.3, "medium": 0.3, "complex": 0.4}
BEFORE_REQUESTS = 1000  # the learning policy starts cold and learns the old mix first
AFTER_REQUESTS = 1000  # the requests scored after the change
WINDOWS = 5  # accuracy after the change in this many equal windows, in arrival order


def drift_items(
    before: int,
    after: int,
    seed: int,
    before_mix: Mapping[str, float] = BEFORE_MIX,
    after_mix: Mapping[str, float] = AFTER_MIX,
) -> list[WorkloadItem]:
    """`before` requests drawn in `before_mix`, then `after` in `after_mix` (the test split,
    seeded): the same list for every policy and every run with the same seed."""
    old = RequestSequence(before_mix, seed)
    new = RequestSequence(after_mix, seed + 1)
    return [old[i] for i in range(before)] + [new[i] for i in range(after)]


def _cost(records: Sequence[RequestRecord], costs: Mapping[str, float]) -> dict[str, Any]:
    """Mean price per request (tier cost x output tokens) and the mean tier cost alone (large
    = 1: the cost against always-large at equal answer lengths), over the answered."""
    done = [r for r in records if r.ok and r.tier in costs]
    if not done:
        return {"cost": None, "tier_cost_vs_large": None}
    return {
        "cost": round(sum(costs[r.tier] * r.output_tokens for r in done) / len(done), 3),
        "tier_cost_vs_large": round(sum(costs[r.tier] for r in done) / len(done), 4),
    }


def _part(
    records: Sequence[RequestRecord],
    items: Mapping[str, WorkloadItem],
    costs: Mapping[str, float],
) -> dict[str, Any]:
    scores = request_scores(records, items)
    answered = [r for r in records if r.ok]
    correct = sum(scores[r.index][1] for r in answered)
    return {
        "requests": len(records),
        "answered": len(answered),
        "accuracy": round(correct / len(answered), 4) if answered else None,
        "accuracy_ci95": accuracy_ci95(scores),
        **_cost(records, costs),
        "answered_by": dict(sorted(Counter(r.tier for r in answered).items())),
        "by_class": {
            c: round(float(np.mean([scores[r.index][1] for r in group])), 4)
            for c in ("simple", "medium", "complex")
            if (group := [r for r in answered if r.request_class == c])
        },
    }


def _windows(
    records: Sequence[RequestRecord], items: Mapping[str, WorkloadItem], count: int
) -> list[float | None]:
    """Accuracy over the answered requests of each of `count` equal runs of `records`."""
    size = max(1, -(-len(records) // count))
    out: list[float | None] = []
    for start in range(0, len(records), size):
        scores = request_scores(records[start : start + size], items)
        answered = [s for ok, s in scores.values() if ok]
        out.append(round(sum(answered) / len(answered), 4) if answered else None)
    return out


def policy_summary(
    records: Sequence[RequestRecord],
    items: Mapping[str, WorkloadItem],
    change_at: int,
    costs: Mapping[str, float],
    feedback: Mapping[str, int],
) -> dict[str, Any]:
    """One policy's run: before and after the change, accuracy by window after it, and the
    Feedback it was sent (`sent`, `accepted`: the router applied it to the decision)."""
    ordered = sorted(records, key=lambda r: r.index)
    before = [r for r in ordered if r.index < change_at]
    after = [r for r in ordered if r.index >= change_at]
    return {
        "before": _part(before, items, costs),
        "after": _part(after, items, costs),
        "after_accuracy_by_window": _windows(after, items, WINDOWS),
        "feedback": dict(feedback),
        "errors": dict(sorted(Counter(r.status for r in ordered if not r.ok).items())),
    }


def after_scores(
    records: Sequence[RequestRecord], items: Mapping[str, WorkloadItem], change_at: int
) -> RequestScores:
    return request_scores([r for r in records if r.index >= change_at], items)


def compared(
    scores: Mapping[str, RequestScores], summaries: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Each policy after the change against the first one, paired on the same requests:
    `quality` (accuracy over accuracy) with its 95% interval, and the tier-cost ratio."""
    names = list(scores)
    if len(names) < 2:
        return {}
    base = names[0]
    out: dict[str, Any] = {}
    for name in names[1:]:
        mine, theirs = summaries[name]["after"], summaries[base]["after"]
        quality = None
        if mine["accuracy"] is not None and theirs["accuracy"]:
            quality = round(mine["accuracy"] / theirs["accuracy"], 4)
        cost = None
        if mine["tier_cost_vs_large"] is not None and theirs["tier_cost_vs_large"]:
            cost = round(mine["tier_cost_vs_large"] / theirs["tier_cost_vs_large"], 4)
        out[f"{name}_vs_{base}"] = {
            "quality": quality,
            "quality_ci95": quality_ci95(scores[name], scores[base])["quality_ci95"],
            "tier_cost": cost,
        }
    return out
