"""The chat session's failover, driven against a fake tier client (tests/fakes/
fake_tier_channels.py): a call failing before its first token is retried once on the next tier
unseen; a call failing or stalling mid-answer goes on on the next tier as a new revision that
replaces the broken one, with an honest kept prefix; the client's text is checked token by token.
"""

from __future__ import annotations

import grpc
import pytest
from tiermesh.v1 import common_pb2, router_pb2, tier_pb2

from services.common.validation import MAX_REQUEST_ID_CHARS
from services.router.chat_events import SessionEvent
from services.router.chat_outcomes import UpstreamFailed
from services.router.chat_plan import ChatPlan, SessionClock, tier_request_id
from services.router.chat_session import ChatSession
from tests.fakes.fake_tier_channels import (
    FakeTierChannels,
    Step,
    answer,
    broken,
    failure,
    silent_after,
)
from tests.unit.test_chat_session import ended, final, kinds, refinement, revision_text, wire

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
ROUTED, PINNED, PROGRESSIVE = (
    router_pb2.MODE_ROUTED,
    router_pb2.MODE_PINNED,
    router_pb2.MODE_PROGRESSIVE,
)
ANSWER = ["The price", " is", " $5"]  # "The price is $5"
SLOW_S = 2.0  # a silence the test never waits out: the stall timeout must end it first


def plan(mode: router_pb2.Mode, tiers: tuple[str, ...], fallbacks: tuple[str, ...]) -> ChatPlan:
    decision = router_pb2.RouteDecision(request_id="r1", mode=mode, tiers=tiers, reason="test")
    return ChatPlan(
        "r1",
        mode,
        tiers,
        tier_pb2.GenerateRequest(max_tokens=16),
        decision,
        fallbacks=fallbacks,
        retry_first_token=mode == ROUTED,
    )


async def run(
    chat: ChatPlan, channels: FakeTierChannels, stall_s: float | None = None
) -> list[SessionEvent]:
    session = ChatSession(chat, channels, 1.0, None, SessionClock(), 5.0, stall_s)
    return [event async for event in session.events()]


def starts(events: list[SessionEvent]) -> list[tuple[int, str, int | None, int]]:
    """(revision, tier, replaces, kept_prefix_chars) of each RevisionStart."""
    return [
        (
            s.revision,
            s.tier,
            s.replaces if s.HasField("replaces") else None,
            s.kept_prefix_chars,
        )
        for s in (e.revision_start for e in wire(events) if e.HasField("revision_start"))
    ]


def check_answer_is_its_revisions_deltas(events: list[SessionEvent]) -> router_pb2.Final:
    """Final's text is exactly its revision's deltas, token ids included: nothing lost or
    doubled."""
    answer_ = final(events)
    deltas = [e.delta for e in wire(events) if e.HasField("delta")]
    mine = [d for d in deltas if d.revision == answer_.revision]
    assert "".join(d.text for d in mine) == answer_.text
    assert [t for d in mine for t in d.token_ids] == list(range(100, 100 + len(ANSWER)))
    return answer_


async def test_failure_before_the_first_token_is_retried_once_unseen() -> None:
    channels = FakeTierChannels({"small": failure(UNAVAILABLE, "down"), "medium": answer(ANSWER)})
    events = await run(plan(ROUTED, ("small",), ("medium", "large")), channels)
    assert kinds(events) == ["route", "revision_start", "delta", "delta", "delta"] + [
        "revision_end",
        "final",
    ]
    assert starts(events) == [(0, "medium", None, 0)]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier, answer_.revisions) == (0, "medium", 1)
    assert answer_.reason == (
        "small failed before its first token (UNAVAILABLE: down); retried on medium; "
        "answered by medium"
    )
    assert ended(events) == {"small": "UNAVAILABLE", "medium": "OK"}


async def test_retry_before_the_first_token_happens_once() -> None:
    channels = FakeTierChannels(
        {
            "small": failure(UNAVAILABLE, "small down"),
            "medium": failure(grpc.StatusCode.INTERNAL, "medium broke"),
            "large": answer(ANSWER),
        }
    )
    with pytest.raises(UpstreamFailed) as raised:
        await run(plan(ROUTED, ("small",), ("medium", "large")), channels)
    assert raised.value.code == grpc.StatusCode.INTERNAL
    assert raised.value.details == "tier medium: medium broke"
    assert "large" not in channels.calls


async def test_pinned_is_not_moved_before_its_first_token() -> None:
    channels = FakeTierChannels({"small": failure(UNAVAILABLE, "down"), "medium": answer(ANSWER)})
    with pytest.raises(UpstreamFailed) as raised:
        await run(plan(PINNED, ("small",), ("medium",)), channels)
    assert raised.value.code == UNAVAILABLE and "medium" not in channels.calls


async def test_bad_input_is_not_retried_elsewhere() -> None:
    bad = failure(grpc.StatusCode.INVALID_ARGUMENT, "prompt: too long")
    channels = FakeTierChannels({"small": bad, "medium": answer(ANSWER)})
    with pytest.raises(UpstreamFailed) as raised:
        await run(plan(ROUTED, ("small",), ("medium",)), channels)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "medium" not in channels.calls


@pytest.mark.parametrize("mode", [ROUTED, PINNED])
async def test_failure_mid_answer_goes_on_as_a_new_revision(mode: router_pb2.Mode) -> None:
    channels = FakeTierChannels(
        {"small": broken(ANSWER[:2], UNAVAILABLE, "killed"), "medium": answer(ANSWER)}
    )
    events = await run(plan(mode, ("small",), ("medium", "large")), channels)
    assert kinds(events) == [
        "route",
        "revision_start",
        "delta",
        "delta",
        "revision_end",
        "revision_start",
        "delta",
        "delta",
        "revision_end",
        "final",
    ]
    broken_end = wire(events)[4].revision_end
    assert (broken_end.revision, broken_end.finish_reason) == (0, "error")
    assert broken_end.error == "UNAVAILABLE: killed"
    assert revision_text(events, 0) == "The price is"
    # revision 1 starts over (full text) and says how much of revision 0 it keeps: all of it
    assert starts(events) == [(0, "small", None, 0), (1, "medium", 0, len("The price is"))]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier, answer_.text) == (1, "medium", "The price is $5")
    assert answer_.revisions == 2
    assert answer_.reason == (
        "small failed after 12 characters (UNAVAILABLE: killed); medium went on as revision 1; "
        "answered by medium"
    )
    assert ended(events) == {"small": "UNAVAILABLE", "medium": "OK"}


async def test_kept_prefix_is_what_the_new_revision_shares() -> None:
    channels = FakeTierChannels(
        {
            "small": broken(["The cost", " was"], UNAVAILABLE, "killed"),
            "medium": answer(ANSWER),
        }
    )
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels)
    assert starts(events)[1] == (1, "medium", 0, len("The "))
    assert check_answer_is_its_revisions_deltas(events).text == "The price is $5"


async def test_stalled_tier_is_cancelled_and_the_answer_goes_on() -> None:
    channels = FakeTierChannels(
        {"small": silent_after(ANSWER[:1], SLOW_S), "medium": answer(ANSWER)}
    )
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels, stall_s=0.05)
    assert channels.call("small").cancelled  # the hung call is cut upstream
    assert wire(events)[3].revision_end.error == (
        "UNAVAILABLE: stalled: no chunk after 1 from tier small within 50 ms"
    )
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier) == (1, "medium")
    assert ended(events) == {"small": "UNAVAILABLE", "medium": "OK"}


async def test_no_first_chunk_within_the_stall_timeout_is_a_failure_retried() -> None:
    channels = FakeTierChannels(
        {"small": answer(ANSWER, first_after_s=SLOW_S), "medium": answer(ANSWER)}
    )
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels, stall_s=0.05)
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier) == (0, "medium")
    assert "no first chunk from tier small within 50 ms" in answer_.reason


async def test_failure_with_no_tier_left_relays_the_error_after_the_broken_revision() -> None:
    channels = FakeTierChannels({"small": broken(ANSWER[:1], UNAVAILABLE, "killed")})
    events: list[SessionEvent] = []
    with pytest.raises(UpstreamFailed) as raised:
        async for event in ChatSession(
            plan(ROUTED, ("small",), ()), channels, 1.0, None, SessionClock()
        ).events():
            events.append(event)
    assert raised.value.code == UNAVAILABLE
    assert kinds(events) == ["route", "revision_start", "delta", "revision_end"]


async def test_refinement_failing_mid_answer_goes_on_as_revision_2() -> None:
    channels = FakeTierChannels(
        {
            "small": answer(["Draft"]),
            "large": broken(ANSWER[:2], UNAVAILABLE, "killed", then_after_s=0.01),
            "medium": answer(ANSWER),
        }
    )
    events = await run(plan(PROGRESSIVE, ("small", "large"), ("medium",)), channels)
    assert starts(events) == [
        (0, "small", None, 0),
        (1, "large", 0, 0),
        (2, "medium", 1, len("The price is")),
    ]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier, answer_.revisions) == (2, "medium", 3)
    assert answer_.reason == (
        "large failed after 12 characters (UNAVAILABLE: killed); medium went on as revision 2; "
        "refined by medium"
    )
    assert refinement(events) == ["completed"]


async def test_draft_failing_mid_answer_is_replaced_by_the_refinement() -> None:
    channels = FakeTierChannels(
        {"small": broken(ANSWER[:2], UNAVAILABLE, "killed"), "large": answer(ANSWER)}
    )
    events = await run(plan(PROGRESSIVE, ("small", "large"), ("medium",)), channels)
    assert starts(events) == [(0, "small", None, 0), (1, "large", 0, len("The price is"))]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier) == (1, "large")
    assert answer_.reason == (
        "draft by small failed after 12 characters (UNAVAILABLE: killed); refined by large"
    )


async def test_tier_calls_carry_the_configured_timeout_without_a_client_deadline() -> None:
    channels = FakeTierChannels({"small": failure(UNAVAILABLE, "down"), "medium": answer(ANSWER)})
    await run(plan(ROUTED, ("small",), ("medium",)), channels)
    assert channels.call("small").timeout_s == channels.call("medium").timeout_s == 5.0


async def test_tier_calls_carry_the_clients_remaining_deadline() -> None:
    channels = FakeTierChannels({"small": answer(ANSWER)})
    session = ChatSession(plan(ROUTED, ("small",), ()), channels, 1.0, 2.0, SessionClock(), 5.0)
    [event async for event in session.events()]
    timeout_s = channels.call("small").timeout_s
    assert timeout_s is not None and 0 < timeout_s <= 2.0


def test_tier_request_ids_are_unique_labelled_and_within_the_limit() -> None:
    ids = {tier_request_id("req-42", "small") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("req-42/small/") for i in ids)
    longest = tier_request_id("r" * MAX_REQUEST_ID_CHARS, "medium")
    assert len(longest) == MAX_REQUEST_ID_CHARS and longest.startswith("rrr")


SMALL_REPLICAS = {"small": ("small-a", "small-b")}


@pytest.mark.parametrize("mode", [ROUTED, PINNED])
async def test_failure_before_the_first_token_moves_to_another_replica(
    mode: router_pb2.Mode,
) -> None:
    scripts = {"small-a": failure(UNAVAILABLE, "down"), "small": answer(ANSWER)}
    channels = FakeTierChannels(scripts, SMALL_REPLICAS)
    events = await run(plan(mode, ("small",), ("medium",)), channels)
    assert starts(events) == [(0, "small", None, 0)]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert [c.endpoint for c in channels.calls["small"]] == ["small-a", "small-b"]
    assert answer_.reason == (
        "small (small-a) failed before its first token (UNAVAILABLE: down); "
        "retried on another small replica; answered by small"
    )


async def test_replica_dying_mid_answer_is_continued_by_another_replica() -> None:
    scripts = {"small-a": broken(ANSWER[:2], UNAVAILABLE, "killed"), "small": answer(ANSWER)}
    channels = FakeTierChannels(scripts, SMALL_REPLICAS)
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels)
    # one revision, one unbroken text: the other replica went on after the tokens sent
    assert kinds(events).count("revision_start") == 1 and kinds(events).count("revision_end") == 1
    assert starts(events) == [(0, "small", None, 0)]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier, answer_.text) == (0, "small", "The price is $5")
    assert "small (small-a) failed after 12 characters" in answer_.reason
    assert "another small replica continued revision 0" in answer_.reason
    continued = channels.calls["small"][1].request
    assert list(continued.continue_token_ids) == [100, 101]
    assert continued.continue_text_chars == len("The price is")
    (end,) = [e.revision_end for e in wire(events) if e.HasField("revision_end")]
    assert end.finish_reason == "stop" and end.usage.completion_tokens == len(ANSWER)
    assert "medium" not in channels.calls


async def test_a_continuation_with_only_a_last_chunk_relays_no_empty_delta() -> None:
    # small-a streamed every token, then died before its last chunk; the other replica answers
    # the continuation with that last chunk alone: no text, no tokens, the finish and usage
    whole = answer(ANSWER)
    last = whole[-1].chunk
    assert last is not None
    last.ClearField("finish_reason")
    last.ClearField("usage")
    end_only = tier_pb2.GenerateChunk(finish_reason="length")
    # as the whole script counts it; the fake counts the continued tokens as prompt
    end_only.usage.CopyFrom(common_pb2.Usage(prompt_tokens=5, completion_tokens=len(ANSWER)))
    scripts = {
        "small-a": broken(ANSWER, UNAVAILABLE, "killed"),
        "small": [*whole, Step(0.0, chunk=end_only)],
    }
    events = await run(
        plan(ROUTED, ("small",), ("medium",)), FakeTierChannels(scripts, SMALL_REPLICAS)
    )
    deltas = [e.delta for e in wire(events) if e.HasField("delta")]
    assert [d.text for d in deltas] == ANSWER  # the last chunk added no Delta
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert answer_.text == "The price is $5"
    assert "another small replica continued revision 0" in answer_.reason
    (end,) = [e.revision_end for e in wire(events) if e.HasField("revision_end")]
    assert end.finish_reason == "length"


async def test_a_continuation_names_its_model_and_one_refused_for_it_goes_on() -> None:
    small_a = broken(ANSWER[:2], UNAVAILABLE, "killed")
    first = small_a[0].chunk
    assert first is not None
    first.model = "small/old"  # the tier names its model on the first chunk with a token
    first.model_fingerprint = "0123456789abcdef"  # and its checkpoint
    other_model = failure(grpc.StatusCode.FAILED_PRECONDITION, "continue_model: small/new here")
    scripts = {"small-a": small_a, "small-b": other_model, "medium": answer(ANSWER)}
    channels = FakeTierChannels(scripts, SMALL_REPLICAS)
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels)
    continued = channels.calls["small"][1].request
    assert (continued.continue_model, continued.continue_model_fingerprint) == (
        "small/old",
        "0123456789abcdef",
    )
    # small-b serves another model: the answer goes on on medium as a new revision
    assert starts(events) == [(0, "small", None, 0), (1, "medium", 0, len("The price is"))]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier) == (1, "medium")
    assert "FAILED_PRECONDITION: continue_model" in answer_.reason


async def test_a_continuation_that_fails_too_goes_on_on_the_next_tier() -> None:
    scripts = {
        "small-a": broken(ANSWER[:2], UNAVAILABLE, "killed"),
        "small-b": failure(UNAVAILABLE, "down too"),
        "medium": answer(ANSWER),
    }
    channels = FakeTierChannels(scripts, SMALL_REPLICAS)
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels)
    # revision 0 (small-a's 12 characters) ends broken; medium replaces it, keeping them all
    assert starts(events) == [(0, "small", None, 0), (1, "medium", 0, len("The price is"))]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert (answer_.revision, answer_.tier) == (1, "medium")
    assert answer_.reason.startswith(
        "small (small-a) failed after 12 characters (UNAVAILABLE: killed); "
        "another small replica continued revision 0; "
        "small (small-b) failed after 12 characters (UNAVAILABLE: down too); "
        "medium went on as revision 1"
    ), answer_.reason
    assert [e.revision_end.finish_reason for e in wire(events) if e.HasField("revision_end")] == [
        "error",
        "stop",
    ]


async def test_with_every_replica_failed_the_next_tier_answers() -> None:
    scripts = {"small": failure(UNAVAILABLE, "down"), "medium": answer(ANSWER)}
    channels = FakeTierChannels(scripts, SMALL_REPLICAS)
    events = await run(plan(ROUTED, ("small",), ("medium",)), channels)
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert answer_.tier == "medium"
    assert [c.endpoint for c in channels.calls["small"]] == ["small-a", "small-b"]


async def test_progressive_without_its_draft_tier_is_answered_by_the_refine_tier() -> None:
    channels = FakeTierChannels({"large": failure(UNAVAILABLE, "down"), "medium": answer(ANSWER)})
    events = await run(plan(PROGRESSIVE, ("large",), ("medium",)), channels)
    assert starts(events) == [(0, "medium", None, 0)]
    answer_ = check_answer_is_its_revisions_deltas(events)
    assert answer_.reason == (
        "no draft; large failed before its first token (UNAVAILABLE: down); retried on medium; "
        "answered by medium"
    )
    assert refinement(events) == []
