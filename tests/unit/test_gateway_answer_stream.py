"""What a plain OpenAI client is shown of a chat's revisions (PlainAnswer), driven by events."""

from __future__ import annotations

import pytest
from tiermesh.client import (
    DeltaEvent,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
    TokenLogprob,
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


def tokens(n: int, *parts: tuple[str, ...]) -> list:
    """A revision's deltas, each a tuple of token texts, with their entries (logprob = -i)."""
    count = iter(range(100))
    return [
        DeltaEvent(n, "".join(part), (), tuple(TokenLogprob(t, -next(count)) for t in part))
        for part in parts
    ]


def test_entries_go_out_with_the_text_they_make() -> None:
    answer = PlainAnswer()
    answer.feed(route("medium"))
    answer.feed(RevisionStartEvent(0, "medium", None, 0))
    released = []
    # a token inside a split character (""), alone in its delta, goes with the next text
    for delta in tokens(0, ("He", "llo"), ("",), ("é", "!"), ("",)):
        answer.feed(delta)
        released.append([e.text for e in answer.pop_entries()])
    assert released == [["He", "llo"], [], ["", "é", "!"], []]
    assert answer.finish(final(0, "Helloé!")) == ""
    assert [e.text for e in answer.pop_entries()] == [""]  # the end-of-sequence token


def test_a_takeover_lists_only_the_new_revisions_tokens_past_the_sent_text() -> None:
    answer = PlainAnswer()
    answer.feed(route("medium"))
    answer.feed(RevisionStartEvent(0, "medium", None, 0))
    for delta in tokens(0, ("Hello", " wo")):
        answer.feed(delta)
    assert [e.text for e in answer.pop_entries()] == ["Hello", " wo"]
    answer.feed(RevisionEndEvent(0, "error", {}, ""))
    answer.feed(RevisionStartEvent(1, "large", 0, 8))
    sent = "".join(answer.feed(d) for d in tokens(1, ("Hel", "lo", " wo"), ("rld",)))
    assert sent == "rld"
    assert [e.text for e in answer.pop_entries()] == ["rld"]


def test_a_takeover_whose_tokens_split_differently_repeats_no_text() -> None:
    answer = PlainAnswer()
    answer.feed(route("medium"))
    answer.feed(RevisionStartEvent(0, "medium", None, 0))
    for delta in tokens(0, ("Hello", " wor")):
        answer.feed(delta)
    answer.feed(RevisionEndEvent(0, "error", {}, ""))
    answer.feed(RevisionStartEvent(1, "large", 0, 9))
    sent = "Hello wor" + "".join(answer.feed(d) for d in tokens(1, ("Hello", " world", "!")))
    sent += answer.finish(final(1, "Hello world!"))
    listed = [e.text for e in answer.pop_entries()]
    assert sent == "Hello world!"
    assert listed == ["Hello", " wor", "ld", "!"]  # " world" straddles: only its "ld"
    assert "".join(listed) == sent
