"""Relays one tier call to the client as a revision of a chat: RevisionStart (with its kept
prefix when it replaces a revision), Deltas, RevisionEnd; and each call's TierCallEnded, once.

Knows the tier calls, the wire events and the session's clock; nothing of plans, failover or
telemetry (chat_session.py decides which call streams as which revision).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import grpc
from tiermesh.v1 import router_pb2, tier_pb2

from services.router.chat_events import SessionEvent, TierCallEnded
from services.router.chat_outcomes import RevisionOutcome, describe, ended_event
from services.router.chat_plan import SessionClock
from services.router.first_chunk import Chunks
from services.router.revisions import KeptPrefix, delta, revision_end, revision_start
from services.router.tier_calls import TierCall


class RevisionRelay:
    """One chat's relay of tier calls as revisions. Not thread-safe: one event loop."""

    def __init__(self, clock: SessionClock) -> None:
        self._clock = clock
        self._reported: set[str] = set()  # request ids of the calls reported ended

    def ended(self, call: TierCall) -> list[TierCallEnded]:
        """The call's TierCallEnded, once: by its failure, its finish, or else as cancelled."""
        if call.request_id in self._reported:
            return []
        self._reported.add(call.request_id)
        return [ended_event(call)]

    async def stream(
        self,
        call: TierCall,
        revision: int,
        previous: str | None,
        outcome: RevisionOutcome,
        chunks: Chunks | None = None,
        end_broken: bool = True,
        after_first: Callable[[], Iterator[SessionEvent]] | None = None,
    ) -> AsyncIterator[SessionEvent]:
        """Relays one tier call as a revision. Nothing is sent if the call fails before its first
        chunk; a replacing revision holds its text until its kept prefix is known. The events of
        `after_first` come right after the revision's first delta is out (never if it has
        none). A call that fails after its first chunk ends its revision (RevisionEnd with the
        error) unless `end_broken` is False: then the caller does (broken_end), or continues
        the revision on another replica."""
        kept = KeptPrefix(previous) if previous is not None else None
        held: list[tier_pb2.GenerateChunk] = []
        replaces = revision - 1 if previous is not None else None
        try:
            async for chunk in chunks if chunks is not None else call.chunks():
                if outcome.started:
                    # a last chunk of only its finish and usage has no Delta: RevisionEnd says both
                    if chunk.text or chunk.token_ids:
                        yield delta(revision, chunk.text, [chunk])
                    continue
                held.append(chunk)
                keep = 0
                if kept is not None:
                    decided = kept.feed(chunk.text)
                    if decided is None and not chunk.finish_reason:
                        continue
                    keep = kept.at_end() if decided is None else decided
                yield self._begin(call, revision, replaces, keep, outcome)
                yield delta(revision, "".join(c.text for c in held), held)
                if after_first is not None:
                    for event in after_first():
                        yield event
            if not outcome.started:
                keep = kept.at_end() if kept is not None else 0
                yield self._begin(call, revision, replaces, keep, outcome)
            outcome.complete = True
            for ended in self.ended(call):
                yield ended
            yield revision_end(revision, call.finish_reason or "stop", call.usage)
        except grpc.aio.AioRpcError as e:
            outcome.error = e
            for ended in self.ended(call):
                yield ended
            if end_broken:
                for event in self.broken_end(call, revision, outcome):
                    yield event

    def broken_end(
        self, call: TierCall, revision: int, outcome: RevisionOutcome
    ) -> Iterator[router_pb2.ChatEvent]:
        """RevisionEnd of a revision its call broke after streaming (nothing otherwise)."""
        if outcome.started and outcome.error is not None:
            e = outcome.error
            finish = "timeout" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else "error"
            yield revision_end(revision, finish, call.usage, describe(e))

    def _begin(
        self,
        call: TierCall,
        revision: int,
        replaces: int | None,
        keep: int,
        outcome: RevisionOutcome,
    ) -> router_pb2.ChatEvent:
        outcome.started = True
        call.revision = revision
        now = self._clock.ms()
        if not self._clock.ttft_ms:
            self._clock.ttft_ms = now
        if revision == 0:
            self._clock.first_draft_ms = now
        return revision_start(revision, call.tier, replaces, keep)
