"""The bench's overload warnings (services/bench/metrics.py): a configuration that failed or shed
more than 5% of its requests is named with its statuses; one within it is not."""

from __future__ import annotations

from typing import Any

from services.bench.metrics import overload_warnings


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
