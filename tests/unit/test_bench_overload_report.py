"""The numbers of `tiermesh bench --scenario overload` (services/bench/overload_report.py) on
plain records: shares of sent per priority and per API key, step-downs counted from the route
decisions' stepped_from and tier, nearest-rank percentiles of TTFT and of the time to a refusal,
quality against the same requests answered unloaded, and the targets judged from them; the
keys' rates and which key sends each request (overload_keys.py)."""

from __future__ import annotations

import pytest

from services.bench.loadgen import RequestRecord
from services.bench.overload_bench import (
    Strided,
    answered_rate,
    capacity_of,
    next_rate,
    parse_priority_mix,
    priority_of,
    unloaded_stride,
)
from services.bench.overload_keys import key_of, key_rates
from services.bench.overload_report import (
    ms_percentiles,
    overload_summary,
    step_downs,
    table_rows,
    targets,
)
from services.bench.scenarios import RequestSequence
from services.workload import WorkloadItem

ITEMS = {
    f"q{i}": WorkloadItem(f"q{i}", "simple", f"prompt {i}", f"answer {i}", f"answer {i}")
    for i in range(10)
}


def _answered(index: int, priority: str, ttft_s: float, text: str, **route: str) -> RequestRecord:
    record = RequestRecord(index, f"q{index}", "simple", 0.0, sent_at_s=1.0, priority=priority)
    record.ttft_s, record.final_s, record.finished_at_s, record.text = ttft_s, 0.5, 1.5, text
    record.server_timings = {"ttft_ms": ttft_s * 1000 / 2}  # the router saw half of it
    record.routed_tier = route.get("tier", "small")
    record.stepped_from = route.get("stepped_from", "")
    return record


def _refused(index: int, priority: str, after_s: float, reason: str) -> RequestRecord:
    record = RequestRecord(index, f"q{index}", "simple", 0.0, sent_at_s=2.0, priority=priority)
    record.status, record.error_reason, record.finished_at_s = (
        "RESOURCE_EXHAUSTED",
        reason,
        2.0 + after_s,
    )
    return record


def test_step_downs_count_moves_by_from_and_to_tier() -> None:
    records = [
        _answered(0, "interactive", 0.1, "", tier="medium", stepped_from="large"),
        _answered(1, "interactive", 0.1, "", tier="medium", stepped_from="large"),
        _answered(2, "interactive", 0.1, "", tier="small", stepped_from="medium"),
        _answered(3, "interactive", 0.1, "", tier="medium", stepped_from="small"),  # stepped up
        _answered(4, "critical", 0.1, "", tier="large"),
    ]
    assert step_downs(records) == {"large->medium": 2, "medium->small": 1, "small->medium": 1}


def test_percentiles_are_nearest_rank_in_milliseconds() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert ms_percentiles(values) == {"p50": 50.0, "p99": 99.0}
    assert ms_percentiles([0.004, None]) == {"p50": 4.0, "p99": 4.0}
    assert ms_percentiles([]) == {"p50": None, "p99": None}


def test_summary_shares_quality_refusals_and_targets() -> None:
    # unloaded: requests 0-5 answered right except 5 (wrong), 6 not answered
    unloaded = [_answered(i, "interactive", 0.010, f"answer {i}") for i in range(5)]
    unloaded += [_answered(5, "interactive", 0.020, "wrong"), _refused(6, "interactive", 0.001, "")]
    loaded = [
        _answered(0, "interactive", 0.030, "answer 0"),
        _answered(1, "interactive", 0.050, "wrong", tier="small", stepped_from="medium"),
        _answered(5, "interactive", 0.040, "answer 5"),  # right now, wrong unloaded
        _refused(7, "interactive", 0.002, "OVERLOADED"),
        _answered(2, "batch", 0.100, "answer 2"),
        _refused(8, "batch", 0.003, ""),
        _refused(9, "batch", 0.060, "FAIR_SHARE"),
        _answered(3, "critical", 0.030, "answer 3"),
        _answered(4, "critical", 0.034, "answer 4"),
    ]
    summary = overload_summary(loaded, unloaded, ITEMS)
    interactive, batch, critical = summary["interactive"], summary["batch"], summary["critical"]
    assert interactive["sent"] == 4 and interactive["answered_share"] == 0.75
    assert interactive["stepped_down_share"] == 0.25
    # matched: 0 (1 vs 1), 1 (0 vs 1), 5 (1 vs 0): 2 right loaded over 2 right unloaded
    assert interactive["quality_vs_unloaded"] == 1.0 and interactive["quality_matched"] == 3
    assert interactive["ttft_ms"] == {"p50": 40.0, "p99": 50.0}
    assert interactive["router_ttft_ms"] == {"p50": 20.0, "p99": 25.0}
    assert interactive["refused"] == {"OVERLOADED": 1}
    assert batch["sent"] == 3 and batch["answered_share"] == pytest.approx(0.3333)
    assert batch["refused"] == {"-": 1, "FAIR_SHARE": 1}
    assert critical["answered_share"] == 1.0 and critical["stepped_down_share"] == 0.0
    assert critical["quality_vs_unloaded"] == 1.0
    assert summary["refusals"] == 3
    assert summary["refusal_ms"] == {"p50": pytest.approx(3.0), "p99": pytest.approx(60.0)}
    assert summary["step_downs"] == {"medium->small": 1}
    assert summary["unloaded"]["sent"] == 7 and summary["unloaded"]["answered"] == 6
    assert summary["unloaded"]["ttft_ms"]["p99"] == 20.0

    judged = targets(summary)
    assert judged["interactive_answered_share"] == {"value": 0.75, "target": 0.99, "met": False}
    assert judged["interactive_quality_vs_unloaded"]["met"] is True
    assert judged["critical_ttft_p99_x_unloaded"] == {"value": 1.7, "target": 2.0, "met": True}
    assert judged["refusal_p99_ms"]["met"] is False  # 60 ms
    rows = table_rows(summary)
    assert rows[0] == ["interactive", "4", "75.0%", "25.0%", "1.000 (n=3)", "40 / 50"]


def test_quality_is_none_when_unloaded_got_none_right() -> None:
    unloaded = [_answered(0, "interactive", 0.01, "wrong")]
    loaded = [_answered(0, "interactive", 0.01, "answer 0")]
    summary = overload_summary(loaded, unloaded, ITEMS)
    assert summary["interactive"]["quality_vs_unloaded"] is None
    assert summary["batch"]["sent"] == 0 and summary["batch"]["answered_share"] is None
    assert targets(summary)["refusal_p99_ms"]["met"] is True  # no refusal at all


def test_priorities_are_seeded_per_request_and_follow_the_mix() -> None:
    pick = priority_of(7)
    drawn = [pick(i) for i in range(3000)]
    assert drawn == [priority_of(7)(i) for i in range(3000)]
    assert drawn != [priority_of(8)(i) for i in range(3000)]
    shares = {p: drawn.count(p) / len(drawn) for p in ("interactive", "batch", "critical")}
    assert shares["interactive"] == pytest.approx(0.2, abs=0.03)
    assert shares["batch"] == pytest.approx(0.75, abs=0.03)
    assert shares["critical"] == pytest.approx(0.05, abs=0.02)
    mixed = priority_of(7, {"interactive": 0.6, "batch": 0.3, "critical": 0.1})
    drawn = [mixed(i) for i in range(3000)]
    assert drawn.count("interactive") / len(drawn) == pytest.approx(0.6, abs=0.03)


@pytest.mark.parametrize(
    ("text", "mix"),
    [
        (
            "interactive=0.6,batch=0.3,critical=0.1",
            {"interactive": 0.6, "batch": 0.3, "critical": 0.1},
        ),
        ("interactive=2, batch=6", {"interactive": 0.25, "batch": 0.75}),  # normalised
        ("critical=1,batch=0", {"critical": 1.0}),  # a share of 0 sends none
    ],
)
def test_a_priority_mix_is_parsed_and_normalised(text: str, mix: dict[str, float]) -> None:
    assert parse_priority_mix(text) == pytest.approx(mix)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("urgent=1", "'urgent' is not a priority"),
        ("batch=1,batch=2", "batch given twice"),
        ("batch=lots", "'lots' is not a number"),
        ("batch=-1", "must be a share >= 0"),
        ("batch=0", "gives no priority a share above 0"),
        ("", "gives no priority a share above 0"),
    ],
)
def test_a_bad_priority_mix_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_priority_mix(text)


def test_the_ramp_doubles_then_halves_the_gap() -> None:
    assert next_rate([1.0], [], 2.0) == 2.0
    assert next_rate([1.0, 2.0], [4.0], 2.0) == pytest.approx(8**0.5)
    assert next_rate([], [4.0], 2.0) == pytest.approx(2.0)


def test_the_unloaded_pass_is_spread_over_the_whole_run() -> None:
    # 2 clients for 10 s of 0.5 s chats: about 40 chats, over 4,000 requests
    assert unloaded_stride(4000, 0.5, 10.0) == 100
    assert unloaded_stride(10, 0.5, 10.0) == 1
    assert unloaded_stride(4000, None, 10.0) == 1
    sequence = RequestSequence({"simple": 1.0}, 3, pools={"simple": list(ITEMS.values())})
    strided = Strided(sequence, 3)
    assert [strided[k].id for k in range(3)] == [sequence[0].id, sequence[3].id, sequence[6].id]


def test_capacity_is_capped_by_what_an_unserved_step_answered_at() -> None:
    records = [
        _answered(i, "interactive", 0.01, "")
        for i in range(4)  # sent at 1.0 s, the last answered at 1.5 s
    ]
    assert answered_rate(records) == 8.0
    assert answered_rate([_refused(0, "interactive", 0.01, "")]) is None
    rows = [
        {"rate_rps": 10.0, "served": True, "answered_rps": 10.0},
        {"rate_rps": 20.0, "served": True, "answered_rps": 12.0},  # the queues absorbed it
        {"rate_rps": 40.0, "served": False, "answered_rps": 14.0},
    ]
    assert capacity_of(rows) == 14.0
    assert capacity_of(rows[:2]) == 20.0  # nothing unserved to bound it
    assert capacity_of(rows[2:]) is None


def _keyed(record: RequestRecord, key: str) -> RequestRecord:
    record.api_key = key
    return record


def test_per_key_share_and_the_slower_keys_target() -> None:
    loaded = [
        _keyed(_answered(0, "interactive", 0.01, "answer 0"), "slow"),
        _keyed(_answered(1, "interactive", 0.01, "answer 1"), "fast"),
        _keyed(_answered(2, "interactive", 0.01, "answer 2"), "fast"),
        _keyed(_refused(3, "interactive", 0.001, "FAIR_SHARE"), "fast"),
    ]
    summary = overload_summary(loaded, [], ITEMS, {"slow": 0.25, "fast": 0.75})
    slow, fast = summary["per_key_share"]["slow"], summary["per_key_share"]["fast"]
    assert (slow["rate_share"], slow["sent"], slow["answered_share"]) == (0.25, 1, 1.0)
    assert (fast["rate_share"], fast["sent"], fast["answered_share"]) == (0.75, 3, 0.6667)
    assert fast["refused"] == {"FAIR_SHARE": 1}
    judged = targets(summary)["slower_key_answered_share"]
    assert judged == {"value": 1.0, "target": 0.99, "met": True}
    assert table_rows(summary)[3][:3] == ["slow (25.0% of rate)", "1", "100.0%"]
    # equal rates: no slower key; no keys: no per_key_share
    equal = overload_summary(loaded, [], ITEMS, {"slow": 0.5, "fast": 0.5})
    assert targets(equal)["slower_key_answered_share"]["met"] is None
    assert overload_summary(loaded, [], ITEMS)["per_key_share"] is None


@pytest.mark.parametrize(
    ("keys", "ratio", "shares"),
    [
        (1, 1.0, [1.0]),
        (2, 1.0, [0.5, 0.5]),
        (2, 10.0, [1 / 11, 10 / 11]),  # the fairness target's two keys
        (3, 4.0, [1 / 7, 2 / 7, 4 / 7]),  # geometric between the first and the last
    ],
)
def test_key_rates(keys: int, ratio: float, shares: list[float]) -> None:
    rates = key_rates(keys, ratio)
    assert list(rates) == [f"bench-key-{k + 1}" for k in range(keys)]
    assert list(rates.values()) == pytest.approx(shares)


def test_keys_are_seeded_per_request_and_follow_their_rates() -> None:
    rates = key_rates(2, 10.0)
    drawn = [key_of(3, rates)(i) for i in range(4000)]
    assert drawn == [key_of(3, rates)(i) for i in range(4000)]
    assert drawn.count("bench-key-1") / len(drawn) == pytest.approx(1 / 11, abs=0.015)
    with pytest.raises(ValueError, match="--key-rate-ratio"):
        key_rates(2, 0.5)
    with pytest.raises(ValueError, match="--keys"):
        key_rates(-1, 1.0)
