"""The chat session's revision, race and cascade logic, driven directly against a fake tier
client (tests/fakes/fake_tier_channels.py): no processes, no sockets."""

from __future__ import annotations

import grpc
import pytest
from tiermesh.v1 import router_pb2, tier_pb2

from services.router.chat_events import (
    RefinementSettled,
    SessionEvent,
    TierCallEnded,
    TierCallOpening,
)
from services.router.chat_outcomes import UpstreamFailed
from services.router.chat_plan import ChatPlan, SessionClock
from services.router.chat_session import ChatSession
from tests.fakes.fake_tier_channels import FakeTierChannels, answer, failure

DRAFT = ["The price", " is $5"]  # "The price is $5"
SLOW_S = 2.0  # a call the test never waits for: something must cancel it first


def plan(
    mode: router_pb2.Mode,
    tiers: tuple[str, ...],
    *,
    gate: str = "always",
    min_confidence: float = 0.0,
    fallback_tier: str | None = None,
    first_token_timeout_s: float = 0.0,
) -> ChatPlan:
    decision = router_pb2.RouteDecision(
        request_id="r1", mode=mode, tiers=tiers, policy="test", reason="test"
    )
    return ChatPlan(
        "r1",
        mode,
        tiers,
        tier_pb2.GenerateRequest(max_tokens=16),
        decision,
        fallback_tier=fallback_tier,
        first_token_timeout_s=first_token_timeout_s,
        gate=gate,
        min_confidence=min_confidence,
    )


def session(
    chat: ChatPlan, channels: FakeTierChannels, refine_budget_s: float = 1.0
) -> ChatSession:
    return ChatSession(chat, channels, refine_budget_s, None, SessionClock())


async def run(chat: ChatPlan, channels: FakeTierChannels, **options: float) -> list[SessionEvent]:
    return [event async for event in session(chat, channels, **options).events()]


def wire(events: list[SessionEvent]) -> list[router_pb2.ChatEvent]:
    return [e for e in events if isinstance(e, router_pb2.ChatEvent)]


def kinds(events: list[SessionEvent]) -> list[str]:
    return [str(e.WhichOneof("event")) for e in wire(events)]


def final(events: list[SessionEvent]) -> router_pb2.Final:
    finals = [e.final for e in wire(events) if e.HasField("final")]
    assert len(finals) == 1
    return finals[0]


def revision_text(events: list[SessionEvent], revision: int) -> str:
    return "".join(e.delta.text for e in wire(events) if e.delta.revision == revision)


def refinement(events: list[SessionEvent]) -> list[str]:
    return [e.outcome for e in events if isinstance(e, RefinementSettled)]


def ended(events: list[SessionEvent]) -> dict[str, str]:
    return {e.tier: e.code for e in events if isinstance(e, TierCallEnded)}


async def test_routed_streams_one_revision() -> None:
    channels = FakeTierChannels({"medium": answer(["Hello", " world"])})
    events = []
    async for event in session(plan(router_pb2.MODE_ROUTED, ("medium",)), channels).events():
        if isinstance(event, TierCallOpening):  # an observer adds trace context to the call
            event.metadata.append(("traceparent", "00-abc-def-01"))
        events.append(event)
    assert kinds(events) == ["route", "revision_start", "delta", "delta", "revision_end", "final"]
    start = wire(events)[1].revision_start
    assert (start.revision, start.tier, start.HasField("replaces")) == (0, "medium", False)
    answer_ = final(events)
    assert (answer_.revision, answer_.tier, answer_.text) == (0, "medium", "Hello world")
    assert answer_.reason == "answered by medium" and answer_.revisions == 1
    call = channels.call("medium")
    assert call.request.request_id.startswith("r1/medium/") and call.request.max_tokens == 16
    assert call.metadata == [("traceparent", "00-abc-def-01")]
    assert ended(events) == {"medium": "OK"} and refinement(events) == []
    # announced before the call starts, and started before RouteDecision is written
    assert isinstance(events[0], TierCallOpening) and kinds(events)[0] == "route"


async def test_routed_relays_the_tiers_error_code() -> None:
    channels = FakeTierChannels({"medium": failure(grpc.StatusCode.UNAVAILABLE, "down")})
    events: list[SessionEvent] = []
    with pytest.raises(UpstreamFailed) as raised:
        async for event in session(plan(router_pb2.MODE_ROUTED, ("medium",)), channels).events():
            events.append(event)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    assert raised.value.details == "tier medium: down"
    assert kinds(events) == ["route"]
    assert ended(events) == {"medium": "UNAVAILABLE"}


async def test_late_first_token_races_the_fallback_tier() -> None:
    channels = FakeTierChannels(
        {"large": answer(["slow"], first_after_s=SLOW_S), "medium": answer(["quick"])}
    )
    chat = plan(
        router_pb2.MODE_ROUTED, ("large",), fallback_tier="medium", first_token_timeout_s=0.05
    )
    events = await run(chat, channels)
    answer_ = final(events)
    assert (answer_.tier, answer_.text) == ("medium", "quick")
    assert answer_.reason == "no first token from large within 50 ms; answered by medium"
    assert channels.call("large").cancelled
    assert ended(events) == {"large": "CANCELLED", "medium": "OK"}


async def test_progressive_always_refinement_replaces_the_draft() -> None:
    channels = FakeTierChannels(
        {"small": answer(DRAFT), "large": answer(["The price is $6"], first_after_s=0.05)}
    )
    events = await run(plan(router_pb2.MODE_PROGRESSIVE, ("small", "large")), channels)
    assert kinds(events) == [
        "route",
        "revision_start",
        "delta",
        "delta",
        "revision_end",
        "revision_start",
        "delta",
        "revision_end",
        "final",
    ]
    start1 = wire(events)[5].revision_start
    assert (start1.revision, start1.tier, start1.replaces) == (1, "large", 0)
    assert start1.kept_prefix_chars == len("The price is $")
    assert revision_text(events, 0) == "The price is $5"
    answer_ = final(events)
    assert (answer_.revision, answer_.tier, answer_.text) == (1, "large", "The price is $6")
    assert answer_.reason == "refined by large" and answer_.revisions == 2
    assert {u.tier: u.revision for u in answer_.usage} == {"small": 0, "large": 1}
    assert refinement(events) == ["completed"]
    assert isinstance(events[-2], RefinementSettled)  # just before Final
    assert answer_.timings.time_to_first_draft_ms <= answer_.timings.time_to_final_ms


async def test_refinement_failure_keeps_the_draft_and_says_why() -> None:
    channels = FakeTierChannels(
        {
            "small": answer(DRAFT, every_s=0.02),
            "large": failure(grpc.StatusCode.UNAVAILABLE, "large down", after_s=0.01),
        }
    )
    events = await run(plan(router_pb2.MODE_PROGRESSIVE, ("small", "large")), channels)
    assert kinds(events) == ["route", "revision_start", "delta", "delta", "revision_end", "final"]
    answer_ = final(events)
    assert (answer_.revision, answer_.tier, answer_.text) == (0, "small", "The price is $5")
    assert answer_.reason == "refinement by large failed (UNAVAILABLE: large down); draft kept"
    assert refinement(events) == ["failed"]
    assert ended(events) == {"small": "OK", "large": "UNAVAILABLE"}


async def test_refinement_past_its_budget_is_cut_and_the_draft_kept() -> None:
    channels = FakeTierChannels(
        {"small": answer(DRAFT), "large": answer(["late"], first_after_s=SLOW_S)}
    )
    chat = plan(router_pb2.MODE_PROGRESSIVE, ("small", "large"))
    events = await run(chat, channels, refine_budget_s=0.05)
    answer_ = final(events)
    assert (answer_.revision, answer_.tier) == (0, "small")
    assert answer_.reason == "refinement by large exceeded its 50 ms budget; draft kept"
    assert refinement(events) == ["timeout"]
    refine = channels.call("large")
    assert refine.timeout_s == pytest.approx(0.05)
    assert refine.stopped_upstream and not refine.read_to_end
    assert "revision_start" not in kinds(events)[3:]


async def test_refinement_that_runs_out_mid_stream_ends_its_revision_as_timeout() -> None:
    slow = answer(["A new", " answer"], first_after_s=0.01, every_s=SLOW_S)
    channels = FakeTierChannels({"small": answer(DRAFT), "large": slow})
    chat = plan(router_pb2.MODE_PROGRESSIVE, ("small", "large"))
    events = await run(chat, channels, refine_budget_s=0.1)
    ends = [e.revision_end for e in wire(events) if e.HasField("revision_end")]
    assert [(e.revision, e.finish_reason) for e in ends] == [(0, "stop"), (1, "timeout")]
    assert ends[1].error == "DEADLINE_EXCEEDED: Deadline Exceeded"
    answer_ = final(events)
    assert (answer_.revision, answer_.tier, answer_.revisions) == (0, "small", 2)
    assert channels.call("large").stopped_upstream


async def test_draft_failing_before_output_lets_the_refine_tier_answer_as_revision_0() -> None:
    channels = FakeTierChannels(
        {
            "small": failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "small full"),
            "large": answer(["Refined answer"], first_after_s=0.02),
        }
    )
    events = await run(plan(router_pb2.MODE_PROGRESSIVE, ("small", "large")), channels)
    assert kinds(events) == ["route", "revision_start", "delta", "revision_end", "final"]
    start = wire(events)[1].revision_start
    assert (start.revision, start.tier, start.HasField("replaces")) == (0, "large", False)
    answer_ = final(events)
    assert (answer_.revision, answer_.tier, answer_.text) == (0, "large", "Refined answer")
    assert answer_.reason == (
        "draft tier small failed (RESOURCE_EXHAUSTED: small full); answered by large"
    )
    assert refinement(events) == []


async def test_progressive_fails_with_the_draft_tiers_code_when_both_fail() -> None:
    channels = FakeTierChannels(
        {
            "small": failure(grpc.StatusCode.UNAVAILABLE, "small down"),
            "large": failure(grpc.StatusCode.INTERNAL, "large broke"),
        }
    )
    with pytest.raises(UpstreamFailed) as raised:
        await run(plan(router_pb2.MODE_PROGRESSIVE, ("small", "large")), channels)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE


async def test_race_gate_cancels_the_refinement_once_the_draft_is_confident() -> None:
    channels = FakeTierChannels(
        {"small": answer(DRAFT, logprob=-0.1), "large": answer(["x"], first_after_s=SLOW_S)}
    )
    chat = plan(router_pb2.MODE_PROGRESSIVE, ("small", "large"), gate="race", min_confidence=0.5)
    events = await run(chat, channels)
    answer_ = final(events)
    assert (answer_.revision, answer_.tier) == (0, "small")
    assert answer_.reason == "draft confident (0.90 >= 0.50); refinement cancelled"
    assert channels.call("large").cancelled
    assert {u.tier: u.cancelled for u in answer_.usage} == {"small": False, "large": True}
    assert refinement(events) == ["cancelled"]
    assert ended(events)["large"] == "CANCELLED"


async def test_race_gate_refines_an_unsure_draft() -> None:
    channels = FakeTierChannels(
        {"small": answer(DRAFT, logprob=-2.0), "large": answer(["The price is $6"])}
    )
    chat = plan(router_pb2.MODE_PROGRESSIVE, ("small", "large"), gate="race", min_confidence=0.5)
    answer_ = final(await run(chat, channels))
    assert (answer_.revision, answer_.tier) == (1, "large")
    assert answer_.reason == "refined by large (draft unsure: 0.14 < 0.50)"


async def test_cascade_skips_the_refinement_for_a_confident_draft() -> None:
    channels = FakeTierChannels({"small": answer(DRAFT, logprob=-0.1), "large": answer(["x"])})
    chat = plan(router_pb2.MODE_PROGRESSIVE, ("small", "large"), gate="cascade", min_confidence=0.5)
    events = await run(chat, channels)
    answer_ = final(events)
    assert (answer_.revision, answer_.tier) == (0, "small")
    assert answer_.reason == "draft confident (0.90 >= 0.50); refinement skipped"
    assert "large" not in channels.calls  # never started
    assert refinement(events) == ["skipped"]


async def test_progressive_starts_the_refinement_after_the_drafts_first_delta() -> None:
    channels = FakeTierChannels({"small": answer(DRAFT), "large": answer(["The price is $6"])})
    events = await run(plan(router_pb2.MODE_PROGRESSIVE, ("small", "large")), channels)
    openings = [(i, e.tier) for i, e in enumerate(events) if isinstance(e, TierCallOpening)]
    first_delta = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, router_pb2.ChatEvent) and e.HasField("delta")
    )
    assert [tier for _, tier in openings] == ["small", "large"]
    assert openings[0][0] == 0 and openings[1][0] == first_delta + 1  # the draft goes first
    assert (final(events).revision, final(events).tier) == (1, "large")


async def test_cascade_starts_the_refinement_after_an_unsure_draft() -> None:
    channels = FakeTierChannels(
        {"small": answer(DRAFT, logprob=-2.0), "large": answer(["The price is $6"])}
    )
    chat = plan(router_pb2.MODE_PROGRESSIVE, ("small", "large"), gate="cascade", min_confidence=0.5)
    events = await run(chat, channels)
    openings = [(i, e.tier) for i, e in enumerate(events) if isinstance(e, TierCallOpening)]
    draft_end = next(
        i
        for i, e in enumerate(events)
        if isinstance(e, router_pb2.ChatEvent) and e.HasField("revision_end")
    )
    assert [tier for _, tier in openings] == ["small", "large"]
    assert openings[1][0] > draft_end  # the refinement starts only once the draft is judged
    assert (final(events).revision, final(events).tier) == (1, "large")


async def test_client_leaving_cancels_both_upstream_calls() -> None:
    channels = FakeTierChannels(
        {
            "small": answer(["a", "b", "c"], every_s=0.2),
            "large": answer(["x"], first_after_s=SLOW_S),
        }
    )
    events = session(plan(router_pb2.MODE_PROGRESSIVE, ("small", "large")), channels).events()
    deltas = 0
    async for event in events:
        if isinstance(event, router_pb2.ChatEvent) and event.HasField("delta"):
            deltas += 1
            if deltas == 2:  # the refinement started after the first
                break
    await events.aclose()  # what the servicer does when the client goes away
    assert channels.call("small").cancelled
    assert channels.call("large").cancelled
