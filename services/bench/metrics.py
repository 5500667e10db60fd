"""Turns request records into the benchmark's numbers: latency percentiles per request class,
throughput, completed/failed/shed counts, accuracy with the workload's scorer, and the ratios
of each configuration against the single-model baseline.

Only requests that arrived after the warm-up count; throughput counts answers completed inside
the measured window. Knows records and the scorer; nothing of gRPC, processes or prices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from services.bench.loadgen import SHED, RequestRecord
from services.common.percentiles import percentile as percentile  # re-exported for the bench
from services.routing.intervals import ratio_ci95
from services.workload import CLASSES, WorkloadItem, score


def _ms(values: Iterable[float | None]) -> dict[str, float | None]:
    present = [v * 1000 for v in values if v is not None]
    p50, p99 = percentile(present, 0.50), percentile(present, 0.99)
    return {
        "p50": None if p50 is None else round(p50, 2),
        "p99": None if p99 is None else round(p99, 2),
        "mean": round(sum(present) / len(present), 2) if present else None,
    }


def in_window(
    records: Iterable[RequestRecord], start_s: float, end_s: float
) -> list[RequestRecord]:
    """Records of requests that arrived in [start_s, end_s)."""
    return [r for r in records if start_s <= r.scheduled_at_s < end_s]


def latency(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """TTFT (first delta of any revision), first draft (revision 0) and end-to-end (Final
    received) in milliseconds, over the completed records."""
    done = [r for r in records if r.ok]
    return {
        "n": len(done),
        "ttft_ms": _ms(r.ttft_s for r in done),
        "first_draft_ms": _ms(r.first_draft_s for r in done),
        "e2e_ms": _ms(r.final_s for r in done),
    }


def accuracy(records: Sequence[RequestRecord], items: Mapping[str, WorkloadItem]) -> float | None:
    """Share of completed records whose final text the workload's scorer accepts."""
    done = [r for r in records if r.ok]
    if not done:
        return None
    return sum(score(items[r.item_id], r.text) for r in done) / len(done)


def summarise(
    records: Sequence[RequestRecord],
    items: Mapping[str, WorkloadItem],
    warmup_s: float,
    end_s: float,
) -> dict[str, Any]:
    """The numbers of one configuration (one load run): counts, throughput, latency and
    accuracy, overall and per request class."""
    measured = in_window(records, warmup_s, end_s)
    window_s = end_s - warmup_s
    finished = [
        r
        for r in records
        if r.ok and r.finished_at_s is not None and warmup_s <= r.finished_at_s <= end_s
    ]
    errors = Counter(r.status for r in measured if not r.ok and r.status != SHED)
    output_tokens = sum(r.output_tokens for r in finished)
    by_class = {c: [r for r in measured if r.request_class == c] for c in CLASSES}
    by_class = {c: rs for c, rs in by_class.items() if rs}
    completed_records = [r for r in measured if r.ok]
    correct = sum(score(items[r.item_id], r.text) for r in completed_records)
    return {
        "requests": {
            "scheduled": len(measured),
            "completed": len(completed_records),
            "failed": sum(errors.values()),
            "shed": sum(1 for r in measured if r.status == SHED),
            "errors": dict(sorted(errors.items())),
        },
        "window_s": round(window_s, 3),
        "throughput_rps": round(len(finished) / window_s, 3),
        "output_tokens": output_tokens,
        "output_tokens_per_s": round(output_tokens / window_s, 2),
        "latency": {"overall": latency(measured), **{c: latency(rs) for c, rs in by_class.items()}},
        "quality": {
            "scorer": "services.workload.score",
            "scored": len(completed_records),
            "correct": correct,
            "accuracy": _round(correct / len(completed_records)) if completed_records else None,
            # over every measured request, one not answered (failed or shed) counted wrong
            "accuracy_all": _round(correct / len(measured)) if measured else None,
            "accuracy_ci95": accuracy_ci95(request_scores(measured, items)),
            "by_class": {c: _round(accuracy(rs, items)) for c, rs in by_class.items()},
        },
        "answered_by": dict(sorted(Counter(r.tier for r in completed_records).items())),
    }


# per measured request, by its index in the seeded sequence: (answered, score of the answer)
RequestScores = Mapping[int, tuple[bool, float]]


def request_scores(
    records: Sequence[RequestRecord], items: Mapping[str, WorkloadItem]
) -> dict[int, tuple[bool, float]]:
    """Each record's (answered, score): an unanswered request (failed, shed) scores 0."""
    return {
        r.index: (r.ok, float(score(items[r.item_id], r.text)) if r.ok else 0.0) for r in records
    }


def _arrays(scores: RequestScores, keys: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    answered = np.asarray([float(scores[k][0]) for k in keys], dtype=np.float64)
    correct = np.asarray([scores[k][1] for k in keys], dtype=np.float64)
    return correct, answered


def accuracy_ci95(scores: RequestScores) -> list[float] | None:
    """The 95% bootstrap interval of the accuracy over the answered requests."""
    return ratio_ci95(*_arrays(scores, sorted(scores)))


def quality_ci95(scores: RequestScores, base: RequestScores) -> dict[str, list[float] | None]:
    """95% bootstrap intervals of `quality` and `quality_all` (see ratios_vs) against the
    baseline, paired: the requests both runs measured (the same seeded schedule) are resampled
    together, so each resample compares the two on the same requests."""
    keys = sorted(scores.keys() & base.keys())
    correct, answered = _arrays(scores, keys)
    base_correct, base_answered = _arrays(base, keys)
    every = np.ones(len(keys), dtype=np.float64)
    return {
        "quality_ci95": ratio_ci95(correct, answered, base_correct, base_answered),
        "quality_all_ci95": ratio_ci95(correct, every, base_correct, base_answered),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 4)


def simple_p99_ttft(config: Mapping[str, Any]) -> float | None:
    simple = config["latency"].get("simple")
    return None if simple is None else simple["ttft_ms"]["p99"]


def ratios_vs(config: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration over the baseline: simple-class P99 TTFT, throughput (completed
    requests/s), cost per 1M output tokens (cpu profile; every profile under cost_by_profile)
    and accuracy. None where the baseline's value is missing or zero."""
    costs, base_costs = (
        config.get("cost_per_1m_output_tokens", {}),
        base.get("cost_per_1m_output_tokens", {}),
    )
    by_profile = {name: _ratio(costs.get(name), base_costs.get(name)) for name in base_costs}
    return {
        "simple_p99_ttft": _ratio(simple_p99_ttft(config), simple_p99_ttft(base)),
        "throughput": _ratio(config["throughput_rps"], base["throughput_rps"]),
        "cost": by_profile.get("cpu"),
        "quality": _ratio(config["quality"]["accuracy"], base["quality"]["accuracy"]),
        # the same with the configuration's own unanswered requests counted wrong (the
        # baseline's accuracy stays over what it answered: its overload is warned apart)
        "quality_all": _ratio(config["quality"].get("accuracy_all"), base["quality"]["accuracy"]),
        "cost_by_profile": by_profile,
    }


def change_pct(value: float | None, base: float | None) -> float | None:
    """(value - base) / base in percent; None when either is missing or base is zero."""
    if value is None or base is None or base == 0:
        return None
    return round((value - base) / base * 100, 1)


# a configuration that failed or shed more than this share of its measured requests was past
# its capacity at the offered rate: ratios against it compare with an overloaded system
OVERLOAD_SHARE = 0.05


def overload_warnings(configurations: Mapping[str, Any]) -> list[str]:
    """One line per configuration that failed or shed over OVERLOAD_SHARE of its requests,
    naming the statuses, since its latency, quality and cost describe only what it completed."""
    lines = []
    for name, config in configurations.items():
        counts = config["requests"]
        scheduled = counts["scheduled"]
        lost = counts["failed"] + counts["shed"]
        if scheduled and lost > OVERLOAD_SHARE * scheduled:
            lines.append(
                f"{_not_answered(name, counts)}: past its capacity at this rate, so its latency, "
                "quality and cost cover only what it completed and ratios against it compare "
                "with an overloaded system; lower --rate for a like-for-like comparison"
            )
    return lines


def unanswered_warnings(configurations: Mapping[str, Any], baseline: str) -> list[str]:
    """One line per compared configuration (not the baseline) that left any measured request
    unanswered but no more than OVERLOAD_SHARE (overload_warnings covers more): its quality
    covers only what it answered, so the line gives it with those counted wrong too."""
    lines = []
    for name, config in configurations.items():
        counts, quality = config["requests"], config["quality"]
        lost = counts["failed"] + counts["shed"]
        if name == baseline or not lost or lost > OVERLOAD_SHARE * counts["scheduled"]:
            continue
        lines.append(
            f"{_not_answered(name, counts)}: its accuracy {quality['accuracy']} covers the "
            f"{quality['scored']} answered; with those counted wrong it is "
            f"{quality['accuracy_all']} (ratios: quality_all)"
        )
    return lines


def _not_answered(name: str, counts: Mapping[str, Any]) -> str:
    """`name: L of S requests not answered (STATUS n, ..., shed n)`."""
    parts = [f"{k} {v}" for k, v in sorted(counts["errors"].items())]
    if counts["shed"]:
        parts.append(f"shed {counts['shed']}")
    lost = counts["failed"] + counts["shed"]
    return f"{name}: {lost} of {counts['scheduled']} requests not answered ({', '.join(parts)})"
