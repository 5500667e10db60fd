"""What a plain OpenAI client is shown of a chat's revisions (PlainAnswer), driven by events."""

from __future__ import annotations

import pytest
from tiermesh.client import (
    DeltaEvent,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
)

from services.gateway.answer_stream import AnswerReplaced, PlainAnswer


def route(*tiers: str) -> RouteEvent:
    return RouteEvent("r", "progressive", tiers, 0.0, "p", "why")


def final(revision: int, text: str) -> FinalEvent:
    return FinalEvent(revision, "t", text, "reason", revision + 1, [], {})


def feed(answer: PlainAnswer, events: list) -> str:
    return "".join(answer.feed(e) for e in events)


def revision(n: int, tier: str, text: str, kept: int = 0, end: str = "stop") -> list:
    replaces = n - 1 if n else None
    return [
        RevisionStartEvent(n, tier, replaces, kept),
        *(DeltaEvent(n, part, ()) for part in text.split("|")),
        RevisionEndEvent(n, end, {}, ""),
    ]


def test_progressive_holds_the_draft_and_streams_the_refinement() -> None:
    answer = PlainAnswer()
    assert feed(answer, [route("small", "large"), *revision(0, "small", "Dra|ft")]) == ""
    assert feed(answer, revision(1, "large", "Ref|ined")) == "Refined"
    assert answer.finish(final(1, "Refined")) == ""


def test_a_draft_that_stays_the_answer_is_released_at_final() -> None:
    answer = PlainAnswer()
    feed(answer, [route("small", "large"), *revision(0, "small", "Draft")])
    assert answer.finish(final(0, "Draft")) == "Draft"


def test_routed_streams_its_only_revision() -> None:
    answer = PlainAnswer()
    assert feed(answer, [route("medium"), *revision(0, "medium", "a|b|c")]) == "abc"
    assert answer.finish(final(0, "abc")) == ""


def test_a_replacing_revision_that_keeps_the_sent_text_takes_over() -> None:
    answer = PlainAnswer()
    sent = feed(answer, [route("medium"), *revision(0, "medium", "Hello wo", end="error")])
    sent += feed(answer, revision(1, "large", "Hello wo|rld", kept=8))
    assert sent + answer.finish(final(1, "Hello world")) == "Hello world"


def test_a_failed_streamed_revision_whose_answer_differs_raises() -> None:
    answer = PlainAnswer()
    feed(answer, [route("small", "large"), *revision(0, "small", "Draft")])
    feed(answer, revision(1, "large", "Refin", end="error"))
    with pytest.raises(AnswerReplaced, match="revision 0"):
        answer.finish(final(0, "Draft"))
