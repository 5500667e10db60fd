"""One revision as the client sees it, relayed from the chunks of the calls that produce it:
RevisionStart (with the prefix it keeps of the revision it replaces), its Deltas, and the
RevisionEnd of a revision broken after streaming. A replacing revision holds its text until its
kept prefix is known.

Pure: takes chunks and times, returns ChatEvents; knows nothing of failover (session_core.py
decides which call streams as which revision) and no gRPC, asyncio or clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tiermesh.v1 import router_pb2, tier_pb2

from services.router.chat_plan import SessionClock
from services.router.revisions import KeptPrefix, delta, revision_end, revision_start
from services.router.session_calls import CallState, TierError, describe


@dataclass
class RevisionStream:
    """One revision relayed to the client from a chain of calls (the first, then those that
    retry or continue it), or the start of the next revision after a broken one."""

    call: CallState
    revision: int
    previous: str | None  # the text the client has of the revision this one replaces
    retry_first: bool  # a failure before the first token may move on to another tier
    refine_clock: bool  # its calls' timeouts come from the refine budget
    failover: bool = True  # False (the draft): a failure ends it
    open_refine_after_first: bool = False
    started: bool = False  # RevisionStart was emitted
    complete: bool = False  # its call finished normally
    error: TierError | None = None
    continuing: bool = False  # the call continues a broken call's answer (same revision)
    kept: KeptPrefix | None = None
    held: list[tier_pb2.GenerateChunk] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the failover did, for Final.reason

    def __post_init__(self) -> None:
        if self.previous is not None:
            self.kept = KeptPrefix(self.previous)

    def relay(
        self, chunk: tier_pb2.GenerateChunk, clock: SessionClock, now: float
    ) -> list[router_pb2.ChatEvent]:
        """A chunk of the stream's call as the client sees it (its call has taken it in)."""
        if self.started:
            # a last chunk of only its finish and usage has no Delta: RevisionEnd says both
            if chunk.text or chunk.token_ids:
                return [delta(self.revision, chunk.text, [chunk])]
            return []
        self.held.append(chunk)
        keep = 0
        if self.kept is not None:
            decided = self.kept.feed(chunk.text)
            if decided is None and not chunk.finish_reason:
                return []
            keep = self.kept.at_end() if decided is None else decided
        return [self._begin(keep, clock, now), self._release_held()]

    def complete_at_end(self, clock: SessionClock, now: float) -> list[router_pb2.ChatEvent]:
        """The stream's call finished: RevisionStart if it never came (with any text held)."""
        self.complete = True
        if self.started:
            return []
        out = [self._begin(self.kept.at_end() if self.kept is not None else 0, clock, now)]
        if self.held:  # a replacing revision's text still held when the stream ended
            out.append(self._release_held())
        return out

    def broken_end(self) -> list[router_pb2.ChatEvent]:
        """RevisionEnd of a revision its call broke after streaming (nothing otherwise)."""
        if not self.started or self.error is None:
            return []
        finish = "timeout" if self.error.code == "DEADLINE_EXCEEDED" else "error"
        return [revision_end(self.revision, finish, self.call.usage, describe(self.error))]

    def _begin(self, keep: int, clock: SessionClock, now: float) -> router_pb2.ChatEvent:
        self.started = True
        self.call.revision = self.revision
        ms = (now - clock.start) * 1000
        if not clock.ttft_ms:
            clock.ttft_ms = ms
        if self.revision == 0:
            clock.first_draft_ms = ms
        replaces = self.revision - 1 if self.previous is not None else None
        return revision_start(self.revision, self.call.tier, replaces, keep)

    def _release_held(self) -> router_pb2.ChatEvent:
        held, self.held = self.held, []
        return delta(self.revision, "".join(c.text for c in held), held)
