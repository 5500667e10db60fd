"""What an OpenAI client is shown of a chat's revisions.

`PlainAnswer` serves stock clients: the text it releases, concatenated, is exactly the answer
(Final's text). It holds every revision but the one the route expects to be the answer (the last
planned: the refinement in progressive mode, the only one otherwise) and streams that one live;
a revision that replaces the live one and keeps at least the text already sent takes over. What
is still held is released when Final names the answer. `revision_fields` and `final_fields` are
the `tiermesh` objects of clients that opted in to every revision.

Pure: events in, text and dicts out; no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tiermesh.client import (
    DeltaEvent,
    Event,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
    TokenLogprob,
)


class AnswerReplaced(Exception):
    """The answer is not the revision already streamed to a plain client (it failed midway and
    an earlier revision became the answer): the client's text cannot be made right."""


class PlainAnswer:
    """Releases a chat's answer text to a client that knows nothing of revisions."""

    def __init__(self) -> None:
        self.planned = 1  # revisions the route plans
        self.live: int | None = None  # the revision streamed as it arrives
        self.sent = ""  # text released so far: always a prefix of the live revision's text
        self.texts: dict[int, str] = {}
        # per revision, its tokens' entries (with top_logprobs) and where each one's text ends
        self._entries: dict[int, list[tuple[int, TokenLogprob]]] = {}
        self._next: dict[int, int] = {}  # per revision, its first entry not released
        self._source: int | None = None  # the revision the released text last came from
        self._covered = 0  # characters of the answer the released entries' texts make
        self._released: list[TokenLogprob] = []

    def feed(self, event: Event) -> str:
        """Text to release now for `event` (often empty); its tokens' entries, when the request
        asked for them, are then in pop_entries()."""
        if isinstance(event, RouteEvent):
            self.planned = max(1, len(event.tiers))
        elif isinstance(event, RevisionStartEvent):
            self.texts[event.revision] = ""
            if self._takes_over(event):
                self.live = event.revision
        elif isinstance(event, DeltaEvent):
            if event.token_logprobs:
                self._add_entries(event)
            self.texts[event.revision] = self.texts.get(event.revision, "") + event.text
            if event.revision == self.live:
                return self._release(self.texts[event.revision], event.revision)
        return ""

    def finish(self, final: FinalEvent) -> str:
        """The rest of the answer; raises AnswerReplaced if what was sent is not its start."""
        if not final.text.startswith(self.sent):
            raise AnswerReplaced(
                f"the streamed revision ({self._live_name()}) did not become the answer: revision "
                f"{final.revision} by {final.tier} is the answer ({final.reason}); "
                "retry, or opt in to revisions to see every one"
            )
        rest = self._release(final.text, final.revision)
        if self._entries:  # and the answer's tokens after its text, if any (end of sequence)
            self._release_entries(final.revision, len(final.text))
        return rest

    def pop_entries(self) -> list[TokenLogprob]:
        """The entries of the tokens whose text was released since the last call: those of the
        revision the text came from whose text ends in it."""
        released, self._released = self._released, []
        return released

    def _add_entries(self, delta: DeltaEvent) -> None:
        entries = self._entries.setdefault(delta.revision, [])
        end = entries[-1][0] if entries else 0
        for entry in delta.token_logprobs:
            end += len(entry.text)
            entries.append((end, entry))

    def _takes_over(self, start: RevisionStartEvent) -> bool:
        if self.live is None:
            return not self.sent and start.revision >= self.planned - 1
        return start.replaces == self.live and start.kept_prefix_chars >= len(self.sent)

    def _release(self, text: str, revision: int) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        new = text[len(self.sent) :]
        self.sent = text
        if self._entries:
            self._release_entries(revision, len(text))
        return new

    def _release_entries(self, revision: int, end: int) -> None:
        """Releases `revision`'s entries whose text ends by `end`; when its text takes over
        from another revision's, not those the released entries already cover, and the one
        that straddles their end only with its text past it (token boundaries may differ)."""
        entries, i = self._entries.get(revision, []), self._next.get(revision, 0)
        if revision != self._source:
            while self._covered and i < len(entries) and entries[i][0] <= self._covered:
                i += 1
            self._source = revision
        while i < len(entries) and entries[i][0] <= end:
            entry_end, entry = entries[i]
            skip = self._covered - (entry_end - len(entry.text))
            if skip > 0:
                entry = replace(entry, text=entry.text[skip:])
            self._released.append(entry)
            self._covered = max(self._covered, entry_end)
            i += 1
        self._next[revision] = i

    def _live_name(self) -> str:
        return f"revision {self.live}" if self.live is not None else "none"


class RevisionTracker:
    """What a chat said about its revisions: the answer's finish reason, and the `tiermesh`
    object of each chunk for clients that opted in to every revision."""

    def __init__(self) -> None:
        self.route: RouteEvent | None = None
        self.starts: dict[int, RevisionStartEvent] = {}
        self.finish_reasons: dict[int, str] = {}
        self.stop_sequences: dict[int, str] = {}  # by revision: the stop sequence that ended it

    def feed(self, event: Event) -> None:
        if isinstance(event, RouteEvent):
            self.route = event
        elif isinstance(event, RevisionStartEvent):
            self.starts[event.revision] = event
        elif isinstance(event, RevisionEndEvent):
            self.finish_reasons[event.revision] = event.finish_reason
            self.stop_sequences[event.revision] = event.stop_sequence

    def finish_reason(self, final: FinalEvent) -> str:
        """OpenAI's finish_reason of the answer: "length" or "stop"."""
        return "length" if self.finish_reasons.get(final.revision) == "length" else "stop"

    def stop_sequence(self, final: FinalEvent) -> str:
        """The stop sequence that ended the answer ("" when none did)."""
        return self.stop_sequences.get(final.revision, "")

    def revision_fields(self, revision: int) -> dict[str, Any]:
        """{revision, replaces, kept_prefix_chars, tier} of a revision that has started."""
        start = self.starts[revision]
        return {
            "revision": revision,
            "replaces": start.replaces,
            "kept_prefix_chars": start.kept_prefix_chars,
            "tier": start.tier,
        }

    def final_fields(self, final: FinalEvent) -> dict[str, Any]:
        """The last chunk's object: the answer's revision and tier, route, reason, timings."""
        route = self.route
        return {
            "final": True,
            "revision": final.revision,
            "tier": final.tier,
            "revisions": final.revisions,
            "reason": final.reason,
            "route": None
            if route is None
            else {
                "request_id": route.request_id,
                "mode": route.mode,
                "tiers": list(route.tiers),
                "complexity": route.complexity,
                "policy": route.policy,
                "reason": route.reason,
                "stepped_from": route.stepped_from,
                "priority": route.priority,
            },
            "timings": final.timings,
            "usage": final.usage,
        }
