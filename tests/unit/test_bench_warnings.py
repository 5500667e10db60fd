"""The bench's overload warnings (services/bench/metrics.py): a configuration that failed or shed
more than 5% of its requests is named with its statuses; one within it is not, but a compared
configuration that left any unanswered is named with its quality counting those wrong, and the
quality target is judged that way too."""

from __future__ import annotations

from typing import Any

from services.bench.metrics import overload_warnings, ratios_vs, unanswered_warnings
from services.bench.report import ratio_table


def _config(scheduled: int, failed: int, shed: int, errors: dict[str, int]) -> dict[str, Any]:
    completed = scheduled - failed - shed
    return {
        "requests": {
            "scheduled": scheduled,
            "completed": completed,
            "failed": failed,
            "shed": shed,
            "errors": errors,
        }
    }


def test_an_overloaded_baseline_is_named_with_its_statuses() -> None:
    configurations = {
        "single": _config(1299, 723, 0, {"RESOURCE_EXHAUSTED": 723}),
        "hybrid": _config(1299, 3, 0, {"DEADLINE_EXCEEDED": 3}),  # 0.2%: within capacity
        "progressive": _config(1000, 20, 40, {"UNAVAILABLE": 20}),  # 6% with the shed
    }
    warnings = overload_warnings(configurations)
    assert len(warnings) == 2
    assert warnings[0].startswith("single: 723 of 1299 requests not answered")
    assert "RESOURCE_EXHAUSTED 723" in warnings[0] and "lower --rate" in warnings[0]
    assert warnings[1].startswith("progressive: 60 of 1000") and "shed 40" in warnings[1]


def test_a_configuration_that_only_shed_is_named_with_its_sheds() -> None:
    warnings = overload_warnings({"hybrid": _config(100, 0, 10, {})})
    assert warnings[0].startswith("hybrid: 10 of 100 requests not answered (shed 10): past")


def test_no_warning_at_exactly_five_percent_or_with_nothing_scheduled() -> None:
    configurations = {
        "single": _config(100, 5, 0, {"RESOURCE_EXHAUSTED": 5}),
        "hybrid": _config(0, 0, 0, {}),
    }
    assert overload_warnings(configurations) == []


def _scored(config: dict[str, Any], correct: int) -> dict[str, Any]:
    counts = config["requests"]
    scheduled, completed = counts["scheduled"], counts["completed"]
    config["quality"] = {
        "scored": completed,
        "correct": correct,
        "accuracy": round(correct / completed, 4),
        "accuracy_all": round(correct / scheduled, 4),
    }
    config.update(throughput_rps=1.0, latency={}, cost_per_1m_output_tokens={})
    return config


def test_a_compared_configuration_with_a_few_unanswered_is_named_with_its_quality_all() -> None:
    configurations = {
        "single": _scored(_config(1299, 903, 0, {"RESOURCE_EXHAUSTED": 903}), 396),
        "hybrid": _scored(_config(1299, 19, 0, {"DEADLINE_EXCEEDED": 19}), 1244),
        "progressive": _scored(_config(1299, 0, 0, {}), 1250),
    }
    (line,) = unanswered_warnings(configurations, "single")  # not the baseline, not progressive
    assert line.startswith("hybrid: 19 of 1299 requests not answered (DEADLINE_EXCEEDED 19)")
    assert "accuracy 0.9719 covers the 1280 answered" in line
    assert "counted wrong it is 0.9577" in line


def test_quality_holds_only_if_it_holds_with_the_unanswered_counted_wrong() -> None:
    single = _scored(_config(1299, 903, 0, {"RESOURCE_EXHAUSTED": 903}), 396)
    hybrid = _scored(_config(1299, 19, 0, {"DEADLINE_EXCEEDED": 19}), 1244)
    ratios = ratios_vs(hybrid, single)
    assert (ratios["quality"], ratios["quality_all"]) == (0.9719, 0.9577)
    table = ratio_table({"ratios": {"hybrid_vs_single": ratios}})
    rows = {row[0]: row for row in table.rows}
    assert rows["quality"][1] == "0.972x ✗"  # over 0.97 answered, under it counting all
    assert rows["quality_all (unanswered counted wrong)"][1] == "0.958x"
    everything = _scored(_config(1299, 0, 0, {}), 1270)
    table = ratio_table({"ratios": {"hybrid_vs_single": ratios_vs(everything, single)}})
    assert {row[0]: row for row in table.rows}["quality"][1] == "0.978x ✓"
