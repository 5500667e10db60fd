"""The interactive `tiermesh chat` without processes: the conversation's history and slash
commands (conversation.py), and one turn (interactive_chat.answer_turn) against a fake router
client that refuses conversations past a length, or is interrupted mid-answer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from tiermesh.client import (
    ChatError,
    DeltaEvent,
    Event,
    FinalEvent,
    RevisionStartEvent,
    RouteEvent,
)
from tiermesh.client.status_details import StatusDetails

from services.cli.conversation import HELP, Conversation, run_command
from services.cli.interactive_chat import CANCELLED, TurnInfo, answer_turn


def _talked(turns: int) -> Conversation:
    conversation = Conversation()
    for n in range(turns):
        conversation.answered(f"q{n}", f"a{n}")
    return conversation


def test_each_question_is_sent_with_the_conversation_so_far() -> None:
    conversation = _talked(2)
    assert conversation.messages("q2") == [
        ("user", "q0"),
        ("assistant", "a0"),
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
    ]
    assert conversation.messages("q2", drop=1) == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
    ]
    assert conversation.messages("q2", drop=2) == [("user", "q2")]
    assert [conversation.can_drop(k) for k in (0, 2, 3)] == [True, True, False]


def test_turns_are_forgotten_only_once_answered_without_them() -> None:
    conversation = _talked(3)
    conversation.messages("q3", drop=2)  # asking without them changes nothing
    assert len(conversation.turns) == 3 and conversation.forgotten == 0
    conversation.answered("q3", "a3", drop=2)
    assert [t.question for t in conversation.turns] == ["q2", "q3"]
    assert conversation.forgotten == 2
    run_command("/new", conversation)
    assert (conversation.turns, conversation.forgotten) == ([], 0)


@pytest.mark.parametrize(
    ("lines", "mode", "tier", "reply"),
    [
        (["/mode progressive"], "progressive", "", "mode: progressive"),
        (["/mode pinned"], "routed", "", "mode pinned needs a tier: /tier small|medium|large"),
        (["/tier medium"], "pinned", "medium", "mode: pinned to medium"),
        (["/tier large", "/mode routed"], "routed", "large", "mode: routed"),
        (
            ["/tier large", "/mode routed", "/mode pinned"],
            "pinned",
            "large",
            "mode: pinned to large",
        ),
        (["/mode fast"], "routed", "", "usage: /mode routed|progressive|pinned"),
        (["/tier huge"], "routed", "", "usage: /tier small|medium|large"),
        (["/mode"], "routed", "", "mode: routed"),
        (["/retry"], "routed", "", "unknown command /retry; /help lists them"),
        (["/help"], "routed", "", HELP),
    ],
)
def test_commands_set_the_mode_and_tier_of_the_next_questions(
    lines: list[str], mode: str, tier: str, reply: str
) -> None:
    conversation = _talked(1)
    replies = [run_command(line, conversation) for line in lines]
    assert (conversation.mode, conversation.tier, replies[-1].text) == (mode, tier, reply)
    assert not any(r.quit for r in replies) and len(conversation.turns) == 1


def test_quit_ends_the_session() -> None:
    assert run_command("/quit", Conversation()).quit
    assert run_command("/exit", Conversation()).quit


class FakeRouterClient:
    """Stands in for RouterClient.chat_stream: refuses (PROMPT_TOO_LONG, after the route event,
    as the router does) a conversation of more than `limit` messages; answers "answer N"; with
    `interrupt`, Ctrl-C arrives after the first delta. Records each request and closed stream."""

    address = "fake"

    def __init__(self, limit: int = 100, interrupt: bool = False) -> None:
        self.limit = limit
        self.interrupt = interrupt
        self.requests: list[dict[str, Any]] = []
        self.closed = 0

    def chat_stream(self, **request: Any) -> Iterator[Event]:
        self.requests.append(request)
        try:
            yield RouteEvent("id", request["mode"], ("small",), 0.1, "static", "easy")
            if len(request["messages"]) > self.limit:
                details = StatusDetails(reason="PROMPT_TOO_LONG")
                raise ChatError("INVALID_ARGUMENT", "prompt: too long", details)
            text = f"answer {len(self.requests)}"
            yield RevisionStartEvent(0, "small", None, 0)
            yield DeltaEvent(0, text, (1,))
            if self.interrupt:
                raise KeyboardInterrupt
            yield FinalEvent(0, "small", text, "answered by small", 1, [], {})
        finally:
            self.closed += 1


class RecordingView:
    def __init__(self) -> None:
        self.shown: list[tuple[int, int, list[Event]]] = []  # (turn, dropped, events)
        self.errors: list[ChatError] = []

    def answer(self, events: Iterable[Event], turn: TurnInfo) -> FinalEvent | None:
        seen: list[Event] = []
        self.shown.append((turn.number, turn.dropped, seen))
        for event in events:
            seen.append(event)
        return next((e for e in seen if isinstance(e, FinalEvent)), None)

    def error(self, error: ChatError, turn: TurnInfo) -> None:
        self.errors.append(error)


def _turn(client: FakeRouterClient, conversation: Conversation, question: str) -> RecordingView:
    view = RecordingView()
    options = {"mode": "routed", "tier": "", "max_tokens": 8}
    answer_turn(client, conversation, question, options, view, 1)  # type: ignore[arg-type]
    return view


def test_a_conversation_no_tier_holds_loses_its_oldest_turns_until_one_does() -> None:
    client, conversation = FakeRouterClient(limit=3), _talked(3)
    conversation.mode, conversation.tier = "pinned", "small"
    view = _turn(client, conversation, "q3")
    # 7 messages, then 5: refused with nothing shown; then 3 messages answered
    assert [len(r["messages"]) for r in client.requests] == [7, 5, 3]
    assert all(
        (r["mode"], r["tier"], r["max_tokens"]) == ("pinned", "small", 8) for r in client.requests
    )
    assert not view.errors
    [(turn, dropped, events)] = view.shown
    assert (turn, dropped) == (1, 2)
    assert [type(e) for e in events] == [RouteEvent, RevisionStartEvent, DeltaEvent, FinalEvent]
    assert [t.question for t in conversation.turns] == ["q2", "q3"]
    assert conversation.turns[-1].answer == "answer 3"
    assert client.closed == 3


def test_a_question_no_tier_holds_alone_is_the_one_length_error() -> None:
    client, conversation = FakeRouterClient(limit=0), _talked(2)
    view = _turn(client, conversation, "q2")
    assert [len(r["messages"]) for r in client.requests] == [5, 3, 1]
    assert [e.details.reason for e in view.errors] == ["PROMPT_TOO_LONG"]
    assert not view.shown
    assert [t.question for t in conversation.turns] == ["q0", "q1"]  # kept as it was


def test_ctrl_c_during_an_answer_cancels_it_and_leaves_the_conversation_as_it_was() -> None:
    client, conversation = FakeRouterClient(interrupt=True), _talked(1)
    view = _turn(client, conversation, "q1")
    assert view.errors == [CANCELLED]
    assert client.closed == 1  # the stream was closed: its call cancelled
    assert [t.question for t in conversation.turns] == ["q0"]
