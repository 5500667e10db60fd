"""`tiermesh chat` with no PROMPT: an interactive conversation through the router.

Reads one line at a time (from a terminal, or piped to stdin); slash commands change the
Conversation (conversation.py), anything else is a question sent with the whole conversation as
`messages`. Answers are drawn live, the draft replaced in place (services/terminal/chat_view.py),
or printed as the `--json` lines with `turn` (and `dropped_turns`) added; prompts, help and
notices go to stderr. Ctrl-C during an answer cancels its call (the router cancels the tiers)
and returns to the prompt; Ctrl-C at the prompt, Ctrl-D or /quit ends the session.
A conversation no tier can hold loses its oldest turns until one can.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console
from tiermesh.client import ChatError, Event, FinalEvent, RouteEvent, RouterClient

from services.cli.conversation import Conversation, is_command, run_command
from services.common.errors import PROMPT_TOO_LONG
from services.terminal.chat_view import (
    print_json_answer,
    print_json_error,
    show_answer,
    show_error,
)

PROMPT = "› "
CANCELLED = ChatError("CANCELLED", "the answer was cancelled (Ctrl-C)")


@dataclass
class TurnInfo:
    number: int  # the question's number in the session, from 1
    started: float  # time.perf_counter() when it was asked
    dropped: int = 0  # earlier turns of the conversation not sent with it


class AnswerView(Protocol):
    """How a turn's answer is shown: as it streams, or why there is none."""

    def answer(self, events: Iterable[Event], turn: TurnInfo) -> FinalEvent | None: ...

    def error(self, error: ChatError, turn: TurnInfo) -> None: ...


class LiveView:
    """The terminal: each answer drawn live, the draft replaced in place by the refinement."""

    def __init__(self) -> None:
        self.console = Console()

    def answer(self, events: Iterable[Event], turn: TurnInfo) -> FinalEvent | None:
        return show_answer(events, self.console)

    def error(self, error: ChatError, turn: TurnInfo) -> None:
        if error is CANCELLED:
            self.console.print("[dim]cancelled[/dim]")
        else:
            show_error(error, self.console)


class JsonView:
    """The `--json` lines of each turn, stdout holding nothing else. Every line gets `turn`
    (the question's number in the session, from 1); `route` and `final` get `dropped_turns`."""

    def answer(self, events: Iterable[Event], turn: TurnInfo) -> FinalEvent | None:
        def extra(event: Event) -> dict[str, Any]:
            if isinstance(event, RouteEvent | FinalEvent):
                return {"turn": turn.number, "dropped_turns": turn.dropped}
            return {"turn": turn.number}

        return print_json_answer(events, turn.started, extra)

    def error(self, error: ChatError, turn: TurnInfo) -> None:
        print_json_error(error, turn.started, {"turn": turn.number})


class LineReader:
    """The user's lines: with line editing (readline) when both ends are a terminal and stdout
    holds the answers' drawing; else plain lines from stdin, the prompt on stderr when a person
    types them."""

    def __init__(self, json_lines: bool) -> None:
        self.typed = sys.stdin.isatty()
        self.editing = self.typed and sys.stdout.isatty() and not json_lines
        if self.editing:
            import readline  # noqa: F401  (input() then edits lines and keeps their history)

    def read(self) -> str | None:
        """The next line, None at the end of input. Ctrl-C raises KeyboardInterrupt."""
        if self.editing:
            try:
                return input(PROMPT)
            except EOFError:
                return None
        if self.typed:
            print(PROMPT, end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        return line.rstrip("\r\n") if line else None


def run_conversation(client: RouterClient, options: dict[str, Any], json_lines: bool) -> int:
    """The conversation until /quit, the end of input or Ctrl-C at the prompt; exit status 0.
    `options` are chat_stream's (mode and tier the first turn's; /mode and /tier change them)."""
    conversation = Conversation(options.get("mode", "routed"), options.get("tier", ""))
    view: AnswerView = JsonView() if json_lines else LiveView()
    reader = LineReader(json_lines)
    if reader.typed:
        notice(
            f"tiermesh chat through {client.address}, {conversation.describe()}; "
            "/help for commands, Ctrl-D to leave"
        )
    turn = 0
    while True:
        try:
            line = reader.read()
        except KeyboardInterrupt:
            line = None
        if line is None:
            if reader.typed:
                notice("")
            return 0
        line = line.strip()
        if not line:
            continue
        if is_command(line):
            reply = run_command(line, conversation)
            if reply.quit:
                return 0
            notice(reply.text)
            continue
        turn += 1
        answer_turn(client, conversation, line, options, view, turn)


def answer_turn(
    client: RouterClient,
    conversation: Conversation,
    question: str,
    options: dict[str, Any],
    view: AnswerView,
    number: int,
) -> None:
    """Sends `question` with the conversation and shows the answer, which joins the
    conversation. While no tier can hold the conversation (PROMPT_TOO_LONG), tries again
    without its oldest turn. A failed or cancelled question leaves the conversation as it was."""
    turn = TurnInfo(number, time.perf_counter())
    drop = 0
    while True:
        request = options | {"mode": conversation.mode, "tier": conversation.tier}
        stream = client.chat_stream(messages=conversation.messages(question, drop), **request)
        try:
            events = _once_started(stream)
            if drop:
                notice(f"earlier turns not sent: {_oldest(drop)} (no tier holds the whole of it)")
            turn.dropped = conversation.forgotten + drop
            final = view.answer(events, turn)
        except ChatError as e:
            if e.details.reason == PROMPT_TOO_LONG and conversation.can_drop(drop + 1):
                drop += 1
                continue
            view.error(e, turn)
            return
        except KeyboardInterrupt:
            view.error(CANCELLED, turn)
            return
        finally:
            if isinstance(stream, Generator):
                stream.close()  # a stream left early cancels its call
        if final is not None:
            conversation.answered(question, final.text, drop)
        return


def _once_started(stream: Iterator[Event]) -> Iterator[Event]:
    """The stream, after reading it up to where the answer starts: a chat the router refuses
    after its route event (a prompt no tier holds) raises here, with nothing shown."""
    head: list[Event] = []
    for event in stream:
        head.append(event)
        if not isinstance(event, RouteEvent):
            break
    return itertools.chain(head, stream)


def _oldest(count: int) -> str:
    turns = "oldest turn" if count == 1 else f"{count} oldest turns"
    return f"the conversation's {turns}"


def notice(text: str) -> None:
    """Prompts, help and notices: stderr, so that stdout holds only the answers."""
    print(text, file=sys.stderr, flush=True)
