"""The bench's 95% bootstrap intervals (services/bench/metrics.py over
services/routing/intervals.py): accuracy over the answered requests, and quality against the
baseline paired on the same requests, from a table of per-request scores."""

from __future__ import annotations

import pytest

from services.bench.metrics import RequestScores, accuracy_ci95, quality_ci95
from services.bench.report import ratio_table


def _scores(pattern: str) -> RequestScores:
    """One request per character: `1` answered right, `0` answered wrong, `-` not answered."""
    return {i: (c != "-", float(c == "1")) for i, c in enumerate(pattern)}


# (name, configuration's scores, baseline's scores, quality interval: lo, hi bounds to hold)
SCENARIOS = [
    # the same answers as the baseline: every paired resample gives exactly 1.0
    ("identical", "1101" * 50, "1101" * 50, (1.0, 1.0), (1.0, 1.0)),
    # always wrong where the baseline is right: quality 0 on every resample
    ("all wrong", "0000" * 50, "1111" * 50, (0.0, 0.0), (0.0, 0.0)),
    # 90% against 100%: the interval holds 0.9 and stays below 1.0
    ("ninety", "1111111110" * 20, "1" * 200, (0.8, 0.9), (0.9, 0.99)),
]


@pytest.mark.parametrize(("name", "config", "base", "low", "high"), SCENARIOS)
def test_quality_interval_from_per_request_scores(
    name: str,
    config: str,
    base: str,
    low: tuple[float, float],
    high: tuple[float, float],
) -> None:
    interval = quality_ci95(_scores(config), _scores(base))["quality_ci95"]
    assert interval is not None, name
    lo, hi = interval
    assert low[0] <= lo <= low[1] and high[0] <= hi <= high[1], (name, interval)


def test_the_same_scores_give_the_same_interval() -> None:
    config, base = _scores("1110" * 60), _scores("1111" * 59 + "0111")
    assert quality_ci95(config, base) == quality_ci95(config, base)


def test_unanswered_requests_count_wrong_only_in_quality_all() -> None:
    # every answered request right, but half not answered
    intervals = quality_ci95(_scores("1-" * 100), _scores("1" * 200))
    assert intervals["quality_ci95"] == [1.0, 1.0]
    lo, hi = intervals["quality_all_ci95"] or (0.0, 0.0)
    assert 0.35 <= lo < 0.5 < hi <= 0.65


def test_requests_only_one_run_measured_are_left_out() -> None:
    config = _scores("1" * 100)
    base = {**_scores("1" * 100), 500: (True, 0.0)}  # a request the configuration never saw
    assert quality_ci95(config, base)["quality_ci95"] == [1.0, 1.0]


def test_accuracy_interval_holds_the_point_and_none_without_answers() -> None:
    lo, hi = accuracy_ci95(_scores("1110" * 50)) or (0.0, 0.0)
    assert lo < 0.75 < hi
    assert accuracy_ci95(_scores("----")) is None
    assert accuracy_ci95({}) is None


def test_the_ratio_table_shows_the_interval() -> None:
    ratios = {"hybrid_vs_single": {"quality": 0.95, "quality_ci95": [0.91, 0.98]}}
    table = ratio_table({"ratios": ratios})
    quality = next(row for row in table.rows if row[0] == "quality")
    assert quality[1] == "0.950x [0.910-0.980] ✗"
