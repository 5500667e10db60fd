"""The drift scenario's numbers (services/bench/drift_summary.py): the seeded stream whose mix
changes midway, and a policy's figures before and after the change from a table of records."""

from __future__ import annotations

from services.bench.drift_summary import (
    after_scores,
    compared,
    drift_items,
    policy_summary,
)
from services.bench.loadgen import RequestRecord
from services.workload import WorkloadItem

COSTS = {"small": 0.05, "medium": 0.25, "large": 1.0}


def test_the_stream_is_seeded_and_its_mix_changes() -> None:
    items = drift_items(400, 400, seed=5)
    assert [i.id for i in items] == [i.id for i in drift_items(400, 400, seed=5)]
    before = sum(i.request_class == "complex" for i in items[:400]) / 400
    after = sum(i.request_class == "complex" for i in items[400:]) / 400
    assert 0.05 < before < 0.16 and 0.32 < after < 0.48


def _records(items: list[WorkloadItem], table: str, tier: str) -> list[RequestRecord]:
    """One record per character: `1` answered right (the reference answer), `0` answered
    wrong, `-` failed."""
    records = []
    for index, (item, mark) in enumerate(zip(items, table, strict=True)):
        record = RequestRecord(index, item.id, item.request_class, 0.0, tier=tier)
        record.output_tokens = 10
        if mark == "-":
            record.status = "UNAVAILABLE"
        else:
            record.text = item.reference if mark == "1" else "no idea"
        records.append(record)
    return records


def test_a_policys_figures_before_and_after_the_change() -> None:
    items = drift_items(20, 20, seed=1)
    by_id = {i.id: i for i in items}
    records = _records(items, "1" * 20 + "10" * 9 + "--", "small")
    summary = policy_summary(records, by_id, 20, COSTS, {"sent": 38, "accepted": 38})
    assert summary["before"]["accuracy"] == 1.0 and summary["before"]["requests"] == 20
    after = summary["after"]
    assert (after["requests"], after["answered"], after["accuracy"]) == (20, 18, 0.5)
    assert after["tier_cost_vs_large"] == 0.05 and after["cost"] == 0.5
    assert after["answered_by"] == {"small": 18}
    assert summary["errors"] == {"UNAVAILABLE": 2}
    assert summary["after_accuracy_by_window"][0] == 0.5
    assert summary["feedback"] == {"sent": 38, "accepted": 38}


def test_a_policy_against_the_first_on_the_same_requests() -> None:
    items = drift_items(0, 40, seed=2)
    by_id = {i.id: i for i in items}
    first = _records(items, "1" * 40, "large")
    second = _records(items, "1" * 36 + "0" * 4, "small")
    summaries = {
        "a": policy_summary(first, by_id, 0, COSTS, {}),
        "b": policy_summary(second, by_id, 0, COSTS, {}),
    }
    scores = {"a": after_scores(first, by_id, 0), "b": after_scores(second, by_id, 0)}
    row = compared(scores, summaries)["b_vs_a"]
    assert row["quality"] == 0.9 and row["tier_cost"] == 0.05
    low, high = row["quality_ci95"]
    assert low < 0.9 < high <= 1.0
    assert compared({"a": scores["a"]}, summaries) == {}
