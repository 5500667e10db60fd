"""`tiermesh chaos`'s pure parts: the fault schedule, the token accounting against a reference
the failover gap read off a chat's recorded events, and the client's loop lag."""

from __future__ import annotations

import asyncio

import pytest
from tiermesh.client import DeltaEvent, FinalEvent
from tiermesh.client.events import RevisionEndEvent, RevisionStartEvent, RouteEvent

from services.bench.loadgen import RequestRecord
from services.chaos.checks import account_tokens, token_diff
from services.chaos.faults import (
    FaultPlanError,
    PlannedFault,
    fault_targets,
    parse_faults,
    plan_faults,
)
from services.chaos.injector import refusal_source
from services.chaos.loop_lag import LoopLag
from services.chaos.recording import StreamTrace
from services.chaos.report import failure_path, slowest_continued

PROCESSES = {"small": ["small", "small-2"], "medium": ["medium"], "large": ["large"]}


def test_faults_take_turns_and_leave_the_end_of_the_run_quiet() -> None:
    kinds = parse_faults("kill-tier,poison")
    targets = {k: fault_targets(k, ("small", "large"), PROCESSES, mesh=False) for k in kinds}
    plan = plan_faults(kinds, targets, duration_s=20, first_at_s=2, every_s=4, quiet_tail_s=5)
    assert plan == [
        PlannedFault("kill-tier", "small", 2),
        PlannedFault("poison", "router", 6),
        PlannedFault("kill-tier", "large", 10),
        PlannedFault("poison", "router", 14),
    ]


def test_faults_that_cannot_be_injected_are_refused_with_the_reason() -> None:
    with pytest.raises(FaultPlanError, match="unknown"):
        parse_faults("kill-tier,meteor")
    with pytest.raises(FaultPlanError, match="--mesh"):
        fault_targets("control-plane", ("small",), PROCESSES, mesh=False)
    with pytest.raises(FaultPlanError, match="--replicas"):
        fault_targets("kill-replica", ("large",), PROCESSES, mesh=False)
    assert fault_targets("kill-replica", ("small",), PROCESSES, mesh=False) == ["small", "small-2"]


def test_token_diff_counts_lost_and_duplicated_tokens() -> None:
    assert token_diff([1, 2, 3, 4], [1, 2, 3, 4]) == (0, 0)
    assert token_diff([1, 2, 3, 4], [1, 2, 4]) == (1, 0)  # 3 lost
    assert token_diff([1, 2, 3, 4], [1, 2, 3, 3, 4]) == (0, 1)  # 3 repeated


def _trace(prompt: str, revisions: list[tuple[str, list[tuple[str, int]], str]]) -> StreamTrace:
    """A chat streamed as `revisions`: (tier, [(text, token id)...], finish reason)."""
    trace = StreamTrace({"prompt": prompt})
    now = 0.0
    for number, (tier, deltas, finish) in enumerate(revisions):
        trace.observe(RevisionStartEvent(number, tier, number - 1 if number else None, 0), now)
        for text, token in deltas:
            now += 0.01
            trace.observe(DeltaEvent(number, text, (token,)), now)
        now += 0.1
        trace.observe(RevisionEndEvent(number, finish, {}, ""), now)
    last = len(revisions) - 1
    text = "".join(t for t, _ in revisions[-1][1])
    trace.observe(FinalEvent(last, revisions[-1][0], text, "", last + 1, [], {}), now)
    return trace


def test_answers_are_checked_against_the_reference_of_the_tier_that_answered() -> None:
    traces = {
        "whole": _trace("p", [("small", [("a", 1), ("b", 2)], "length")]),
        "failed over": _trace(
            "p",
            [("small", [("a", 1)], "error"), ("medium", [("x", 7), ("y", 8)], "length")],
        ),
        "repeated": _trace("q", [("small", [("c", 3), ("c", 3), ("d", 4)], "length")]),
        "no reference": _trace("r", [("large", [("z", 9)], "length")]),
    }
    references = {("p", "small"): [1, 2], ("p", "medium"): [7, 8], ("q", "small"): [3, 4]}
    account = account_tokens(traces, references)
    assert (account.checked, account.unchecked) == (3, 1)
    assert (account.lost, account.duplicated) == (0, 1)
    assert account.examples == ["repeated"]
    assert account.text_mismatches == 0
    gaps = traces["failed over"].failover_gaps_s()
    assert len(gaps) == 1 and gaps[0][0] == pytest.approx(0.11) and gaps[0][1] == pytest.approx(0.1)
    (failover,) = traces["failed over"].failovers()
    assert failover.broken_tokens == 1 and failover.gap_s == pytest.approx(0.11)


async def test_the_client_loop_lag_is_sampled_and_summed_up_over_a_window() -> None:
    lag = LoopLag(interval_s=0.005)
    clock = iter(range(1000))
    follow = asyncio.create_task(lag.follow(lambda: float(next(clock))))
    while len(lag.samples) < 4:
        await asyncio.sleep(0.005)
    follow.cancel()
    assert all(late >= 0 for _, late in lag.samples)
    lag.samples = [(0.0, 0.001), (1.0, 0.004), (2.0, 0.1), (3.0, 0.002)]
    assert lag.summary_ms(0.5, 2.5) == {"p50": 4.0, "p99": 100.0, "max": 100.0}  # nearest rank
    assert lag.summary_ms(5.0)["p99"] is None


def test_a_refusal_is_put_down_to_who_refused_it() -> None:
    assert refusal_source("every tier full: small full (16 running, 64 queued)") == "router"
    assert refusal_source("router at capacity: 256 chats in flight (limit 256)") == "router"
    admission = "tier large: tier at capacity: queue full (16 running, 64 queued, ...)"
    assert refusal_source(admission) == "large at admission"
    late = "tier medium: tier at capacity: no running slot within 10.00 s (16 running, ...)"
    assert refusal_source(late) == "medium after queueing"


def test_a_break_continued_in_the_same_revision_is_timed_by_its_longest_pause() -> None:
    trace = StreamTrace({"prompt": "p"})
    trace.observe(RevisionStartEvent(0, "small", None, 0), 0.0)
    for token, at in enumerate([0.01, 0.02, 0.5, 0.51, 0.52, 0.8]):  # breaks at 0.02 and 0.52
        trace.observe(DeltaEvent(0, "a", (token,)), at)
    trace.observe(RevisionEndEvent(0, "length", {}, ""), 0.9)
    reason = (
        "small (a) failed after 2 characters (UNAVAILABLE: x); another small replica continued "
        "revision 0; small (b) failed after 5 characters (UNAVAILABLE: y); another small replica "
        "continued revision 0; answered by small"
    )
    trace.observe(FinalEvent(0, "small", "aaaaaa", reason, 1, [], {}), 0.9)
    assert trace.continuation_gaps_s() == pytest.approx([0.48, 0.28])
    assert trace.failovers() == []  # no revision broke


def test_a_failed_chat_is_summed_up_by_its_path() -> None:
    # small broke after two tokens, medium failed before its first: one path, grouped by tier
    trace = _trace("p", [("small", [("a", 1), ("b", 2)], "error"), ("medium", [], "error")])
    record = RequestRecord(
        7, "item", "simple", 0.0, status="UNAVAILABLE", error="tier medium: Stream removed"
    )
    assert failure_path(record, trace) == "small >0! > medium 0! | UNAVAILABLE tier medium"
    refused = RequestRecord(
        8, "item", "simple", 0.0, status="RESOURCE_EXHAUSTED", error="every tier full"
    )
    assert failure_path(refused, None) == "no revision | RESOURCE_EXHAUSTED"


def test_theslowest_continued_breaks_are_listed_longest_first() -> None:
    traces, records = {}, []
    for index, pause in enumerate([0.3, 0.9, 0.1]):
        trace = StreamTrace({"prompt": "p"})
        trace.observe(RevisionStartEvent(0, "small", None, 0), 0.0)
        for token, at in enumerate([0.01, 0.01 + pause, 0.02 + pause]):
            trace.observe(DeltaEvent(0, "a", (token,)), at)
        reason = f"small (r{index}) failed after 1 characters; another small replica continued "
        reason += "revision 0; answered by small"
        trace.observe(FinalEvent(0, "small", "aaa", reason, 1, [], {}), 1.0)
        traces[f"bench-chaos-{index}"] = trace
        records.append(RequestRecord(index, "item", "simple", index * 1.0, sent_at_s=index * 1.0))
    slowest = slowest_continued(records, traces)
    assert [s["gap_ms"] for s in slowest] == [900.0, 300.0, 100.0]
    assert [s["sent_at_s"] for s in slowest] == [1.0, 0.0, 2.0]
    assert "(r1)" in slowest[0]["reason"]


@pytest.mark.parametrize(
    ("stepped_from", "tiers", "expected"),
    [
        ("large", ("medium",), "large->medium"),  # overload moved it down
        ("small", ("medium",), "small->medium"),  # ... or up, when the smaller tier was missing
        ("", ("large",), None),  # the policy's own tier
    ],
)
def test_a_chat_moved_by_overload_is_counted_as_a_step_down(
    stepped_from: str, tiers: tuple[str, ...], expected: str | None
) -> None:
    trace = StreamTrace({"prompt": "p"})
    assert trace.step_down is None  # no route seen yet
    route = RouteEvent("r", "routed", tiers, 0.5, "threshold", "why", stepped_from)
    trace.observe(route, 0.0)
    assert trace.step_down == expected
