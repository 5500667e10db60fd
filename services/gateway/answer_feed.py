"""One chat's answer as any wire format shows it: router events in, text pieces and the answer's
end out, in terms no API owns, so that the Messages, Responses and text completions formats
encode the same thing. Plain clients get PlainAnswer's one coherent text; clients that opt in
to every revision get each revision's text with its `tiermesh` object (RevisionTracker), as
chat completions does.

Pure: events in, plain data out; nothing of HTTP, SSE or any API's field names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiermesh.client import DeltaEvent, Event, FinalEvent, RevisionStartEvent

from services.gateway.answer_stream import PlainAnswer, RevisionTracker
from services.gateway.openai_wire import usage


@dataclass(frozen=True)
class TextPiece:
    """Text to show next. With the revisions opt-in, `revision` is the revision's `tiermesh`
    object ({revision, replaces, kept_prefix_chars, tier}) and a revision's first piece has
    empty text; for plain clients it is None and the texts concatenated are the answer."""

    text: str
    revision: dict[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    """A chat's answer: its text, "stop" or "length", OpenAI-style usage (`prompt_tokens`,
    `completion_tokens`, `total_tokens`) and, with the revisions opt-in, the final `tiermesh`
    object (answer revision and tier, reason, route, timings, per-tier usage)."""

    text: str
    finish_reason: str
    usage: dict[str, int]
    tiermesh: dict[str, Any] | None = None
    stop_sequence: str = ""  # the stop sequence that ended it, when one did

    @classmethod
    def from_completion(cls, completion: dict[str, Any]) -> Answer:
        """The answer of a one-choice `chat.completion` (completions.complete's)."""
        choice = completion["choices"][0]
        return cls(
            choice["message"]["content"],
            choice["finish_reason"],
            completion["usage"],
            completion.get("tiermesh"),
            choice.get("stop_reason") or "",
        )


class AnswerFeed:
    """Feed every router event of one chat in order; `feed` returns the pieces to send now
    and, after Final, `answer` is set. A plain client's Final raises AnswerReplaced when the
    text already sent is not the answer's start (answer_stream.py)."""

    def __init__(self, revisions: bool) -> None:
        self.revisions = revisions
        self.plain = PlainAnswer()
        self.tracker = RevisionTracker()
        self.answer: Answer | None = None

    def feed(self, event: Event) -> list[TextPiece]:
        self.tracker.feed(event)
        pieces: list[TextPiece] = []
        if self.revisions:
            if isinstance(event, RevisionStartEvent):
                pieces.append(TextPiece("", self.tracker.revision_fields(event.revision)))
            elif isinstance(event, DeltaEvent) and event.text:
                pieces.append(TextPiece(event.text, self.tracker.revision_fields(event.revision)))
        elif text := self.plain.feed(event):
            pieces.append(TextPiece(text))
        if isinstance(event, FinalEvent):
            if not self.revisions and (rest := self.plain.finish(event)):
                pieces.append(TextPiece(rest))
            self.answer = Answer(
                event.text,
                self.tracker.finish_reason(event),
                usage(event),
                self.tracker.final_fields(event) if self.revisions else None,
                self.tracker.stop_sequence(event),
            )
        return pieces
