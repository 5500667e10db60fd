"""One chat through the router as a state machine: starts the tier calls of a plan and turns
their chunks into revisions, yielding each event as it happens.

States: routed (RouteDecision sent) -> a revision streaming (RevisionStart, Delta..., RevisionEnd)
-> maybe another revision -> final (exactly one Final), or failed (UpstreamFailed raised, no
Final). The first tier call is started before RouteDecision is written, so the two overlap.
ROUTED and PINNED stream one tier as revision 0. PROGRESSIVE starts the draft tier, streams it as
revision 0 and starts the refine tier once the draft's first delta is out (or the draft ended
without one), so the refinement's prefill never delays the draft; the refinement then streams
as revision 1 replacing the draft; if it fails or runs over its budget, the draft is the answer.
Every upstream call still running when the session ends (client gone, error, deadline) is
cancelled.

Failover: a failed call moves on to another replica of its tier while one is left untried,
then along the plan's `fallbacks` (each tier at most once). One that fails before its first
chunk is retried there unseen, in the same revision (on another tier only once, and only for
ROUTED chats and refinements). One that fails after streaming is continued by another replica of
its tier in the same revision (the replica prefills the prompt and the tokens already sent and
decodes on: the client sees one unbroken text); on another tier it goes on as a new revision
that replaces the broken one, its kept prefix computed against the text the client already has.
A call a tier refused for overload moves on only to a replica or tier whose last load report
says it would start it at once; else the refusal, with its retry delay, is relayed at once.
Final.reason says what happened. A call with no chunk for the stall timeout has failed.

Knows the tier calls and the wire events (revision_relay.py relays a call as a revision); knows
nothing of telemetry or learning, which watch the events it yields (chat_events.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterator
from typing import Any

import grpc
from tiermesh.v1 import router_pb2, tier_pb2

from services.router.chat_events import (
    RefinementSettled,
    SessionEvent,
    TierCallOpening,
)
from services.router.chat_outcomes import (
    FAILOVER_CODES,
    Answer,
    RevisionOutcome,
    UpstreamFailed,
    describe,
    final_event,
    refine_failure,
)
from services.router.chat_plan import ChatPlan, SessionClock, tier_request_id
from services.router.first_chunk import Chunks, first_chunk_race, prepend
from services.router.revision_relay import RevisionRelay
from services.router.tier_calls import TierCall, TierClient

FINAL_MARGIN_S = 0.05  # time kept back from the client's deadline to send Final after a refine


class ChatSession:
    """One chat; read it once with events(). Not thread-safe: one event loop."""

    def __init__(
        self,
        plan: ChatPlan,
        tiers: TierClient,
        refine_budget_s: float,
        time_remaining_s: float | None,
        clock: SessionClock,
        call_timeout_s: float | None = None,
        stall_s: float | None = None,
        room: Callable[[str, Collection[str]], bool] | None = None,
    ) -> None:
        """Tier calls carry the client's deadline, else `call_timeout_s` (None: none); a call
        with no chunk for `stall_s` fails (None: never). `room(tier, tried)`: whether a replica
        of the tier, none of those tried, would start a call at once; a call refused for
        overload (RESOURCE_EXHAUSTED) moves on only to such a tier, else the refusal is the
        answer (None: it moves on like any failure)."""
        self._plan = plan
        self._tiers = tiers
        self._refine_budget_s = refine_budget_s
        self._call_timeout_s = call_timeout_s
        self._stall_s = stall_s
        self._room = room
        self._refine_deadline: float | None = None
        self._deadline = None if time_remaining_s is None else clock.start + time_remaining_s
        self._clock = clock
        self._calls: list[TierCall] = []
        self._relay = RevisionRelay(clock)
        self._racing: list[asyncio.Future[Any]] = []  # first-chunk reads still in flight
        self._routed = False  # RouteDecision yielded

    async def events(self) -> AsyncGenerator[SessionEvent, None]:
        """The chat's events, RouteDecision first and Final last; raises UpstreamFailed. Closing
        the iterator early (the client left) cancels every upstream call."""
        try:
            if self._plan.mode == router_pb2.MODE_PROGRESSIVE:
                async for event in self._progressive():
                    yield event
            else:
                async for event in self._single():
                    yield event
        finally:
            for future in self._racing:
                future.cancel()
            for call in self._calls:
                call.cancel()

    def _client_remaining_s(self) -> float | None:
        """Seconds left of the client's deadline; None when it set none."""
        if self._deadline is None:
            return None
        return max(0.001, self._deadline - time.perf_counter())

    def _remaining_s(self) -> float | None:
        """The timeout of a tier call: the client's deadline, else the configured default."""
        remaining = self._client_remaining_s()
        return self._call_timeout_s if remaining is None else remaining

    def _route(self) -> Iterator[router_pb2.ChatEvent]:
        """RouteDecision, once: right after the first tier call is started."""
        if not self._routed:
            self._routed = True
            yield router_pb2.ChatEvent(route=self._plan.decision)

    def _opening(self, tier: str) -> TierCallOpening:
        return TierCallOpening(tier, tier_request_id(self._plan.request_id, tier))

    def _open(
        self, opening: TierCallOpening, timeout_s: float | None, broken: TierCall | None = None
    ) -> TierCall:
        """Starts the call announced by `opening`, with the metadata observers gave it; with
        `broken` (a call of the same tier), one that continues its answer."""
        request = tier_pb2.GenerateRequest()
        request.CopyFrom(self._plan.generate)
        request.request_id = opening.request_id
        if broken is not None:
            request.continue_token_ids.extend(broken.token_ids)
            request.continue_text_chars = len(broken.text)
            if request.sampling.HasField("top_logprobs"):  # for the held tokens' entries
                request.continue_logprobs.extend(broken.logprobs)
            request.continue_model = broken.model  # a replica of another model refuses
            request.continue_model_fingerprint = broken.model_fingerprint
        tier = opening.tier
        endpoint = self._tiers.pick(tier, self._tried()) or self._tiers.endpoints(tier)[0]
        call = TierCall(
            self._tiers, tier, endpoint, request, timeout_s, opening.metadata, self._stall_s
        )
        if broken is not None:
            call.continue_from(broken)
        self._calls.append(call)
        return call

    def _tried(self) -> set[str]:
        return {call.endpoint for call in self._calls}

    def _who(self, call: TierCall) -> str:
        """The call's tier, and its replica when the tier has several."""
        if len(self._tiers.endpoints(call.tier)) > 1:
            return f"{call.tier} ({call.endpoint})"
        return call.tier

    async def _single(self) -> AsyncIterator[SessionEvent]:
        plan = self._plan
        opening = self._opening(plan.tiers[0])
        yield opening
        call = self._open(opening, self._remaining_s())
        for route in self._route():
            yield route
        chunks = call.chunks()
        reason = f"answered by {call.tier}"
        if plan.fallback_tier and plan.first_token_timeout_s > 0:
            first = asyncio.ensure_future(anext(chunks))
            self._racing.append(first)
            done, _ = await asyncio.wait({first}, timeout=plan.first_token_timeout_s)
            if done:
                chunks = prepend(first, chunks)
            else:  # no first chunk in time: the fallback tier races it
                opening = self._opening(plan.fallback_tier)
                yield opening
                backup = self._open(opening, self._remaining_s())
                winner, chunks = await first_chunk_race(call, chunks, first, backup, self._racing)
                for ended in self._relay.ended(backup if winner is call else call):
                    yield ended
                if winner is backup:
                    reason = (
                        f"no first token from {plan.tiers[0]} within "
                        f"{plan.first_token_timeout_s * 1000:.0f} ms; answered by {backup.tier}"
                    )
                call = winner
        result = Answer(call, 0)
        retry = plan.retry_first_token
        async for event in self._with_failover(result, None, retry, self._remaining_s, chunks):
            yield event
        if not result.complete:
            assert result.error is not None
            raise UpstreamFailed(result.call.tier, result.error)
        if result.notes:
            reason = "; ".join([*result.notes, f"answered by {result.call.tier}"])
        for event in self._final(result.call, result.revision, reason):
            yield event

    async def _with_failover(
        self,
        result: Answer,
        previous: str | None,
        retry_first: bool,
        timeout_s: Callable[[], float | None],
        chunks: Chunks | None = None,
    ) -> AsyncIterator[SessionEvent]:
        """Streams `result.call` as `result.revision` (replacing `previous`, the text the client
        has of the revision before, if any); when it fails, moves on along the plan's fallbacks
        (see the module's docstring); another replica of the same tier comes first. `result`
        holds where it ended."""
        call = result.call
        continuing = False  # `call` continues the revision a broken call of its tier began
        while True:
            outcome = RevisionOutcome(started=continuing)
            if continuing:
                call.revision = result.revision
            async for event in self._relay.stream(
                call, result.revision, None if continuing else previous, outcome, chunks, False
            ):
                yield event
            chunks = None
            result.call, result.complete, result.error = call, outcome.complete, outcome.error
            error = outcome.error
            if error is None or (  # a replica of another model refuses a continuation: on
                error.code() not in FAILOVER_CODES
                and not (continuing and error.code() == grpc.StatusCode.FAILED_PRECONDITION)
            ):
                for event in self._relay.broken_end(call, result.revision, outcome):
                    yield event
                return
            tried = self._tried()
            room = self._room if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else None
            if any(e not in tried for e in self._tiers.endpoints(call.tier)) and (
                room is None or room(call.tier, tried)
            ):
                after, where = call.tier, f"another {call.tier} replica"
            else:
                called = {c.tier for c in self._calls}
                left = [
                    tier
                    for tier in self._plan.fallbacks
                    if tier not in called and (room is None or room(tier, tried))
                ]
                if not left:
                    for event in self._relay.broken_end(call, result.revision, outcome):
                        yield event
                    return
                after = where = left[0]
            who = f"{self._who(call)} failed"
            continuing = outcome.started and after == call.tier
            if continuing:
                result.notes.append(
                    f"{who} after {len(call.text)} characters ({describe(error)}); "
                    f"{where} continued revision {result.revision}"
                )
                opening = self._opening(after)
                yield opening
                call = self._open(opening, timeout_s(), broken=call)
                continue
            for event in self._relay.broken_end(call, result.revision, outcome):
                yield event
            if outcome.started:
                result.notes.append(
                    f"{who} after {len(call.text)} characters ({describe(error)}); "
                    f"{where} went on as revision {result.revision + 1}"
                )
                previous = call.text
                result.revision += 1
            elif after == call.tier or retry_first:
                result.notes.append(
                    f"{who} before its first token ({describe(error)}); retried on {where}"
                )
                retry_first = retry_first and after == call.tier
            else:
                return
            opening = self._opening(after)
            yield opening
            call = self._open(opening, timeout_s())

    async def _progressive(self) -> AsyncIterator[SessionEvent]:
        plan = self._plan
        if len(plan.tiers) == 1:  # the draft tier was down: the refine tier answers alone
            opening = self._opening(plan.tiers[0])
            yield opening
            call = self._open(opening, self._remaining_s())
            for route in self._route():
                yield route
            async for event in self._alone(call, "no draft", self._remaining_s):
                yield event
            return
        draft_tier, refine_tier = plan.tiers
        opening = self._opening(draft_tier)
        yield opening
        draft = self._open(opening, self._remaining_s())
        for route in self._route():
            yield route
        refines: list[TierCall] = []

        def start_refine() -> Iterator[SessionEvent]:
            opening = self._opening(refine_tier)
            yield opening
            refines.append(self._open(opening, self._refine_timeout_s()))

        first = RevisionOutcome()
        after_first = start_refine if plan.gate != "cascade" else None
        async for event in self._relay.stream(draft, 0, None, first, after_first=after_first):
            yield event
        refine = refines[0] if refines else None
        if first.complete and plan.gate != "always" and draft.confidence >= plan.min_confidence:
            verdict = "cancelled" if refine is not None else "skipped"
            reason = (
                f"draft confident ({draft.confidence:.2f} >= {plan.min_confidence:.2f}); "
                f"refinement {verdict}"
            )
            for event in self._final(draft, 0, reason, verdict):
                yield event
            return
        if refine is None:
            opening = self._opening(refine_tier)
            yield opening
            refine = self._open(opening, self._refine_timeout_s())
        if not first.started:  # the draft tier failed before any output: refine answers alone
            assert first.error is not None
            note = f"draft tier {draft_tier} failed ({describe(first.error)})"
            failed = UpstreamFailed(draft_tier, first.error)
            async for event in self._alone(refine, note, self._refine_timeout_s, failed):
                yield event
            return
        second = Answer(refine, 1)
        async for event in self._with_failover(second, draft.text, True, self._refine_timeout_s):
            yield event
        notes = second.notes
        if first.error is not None:
            broken = f"after {len(draft.text)} characters ({describe(first.error)})"
            notes = [f"draft by {draft_tier} failed {broken}", *notes]
        if second.complete:
            reason = f"refined by {second.call.tier}"
            if plan.gate != "always":
                reason += f" (draft unsure: {draft.confidence:.2f} < {plan.min_confidence:.2f})"
            reason = "; ".join([*notes, reason])
            for event in self._final(second.call, second.revision, reason, "completed"):
                yield event
        elif first.complete:
            assert second.error is not None
            timed_out = second.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            failure = "; ".join([*notes, refine_failure(second.call, second.error)])
            for event in self._final(draft, 0, failure, "timeout" if timed_out else "failed"):
                yield event
        else:
            assert first.error is not None
            raise UpstreamFailed(draft_tier, first.error)

    async def _alone(
        self,
        call: TierCall,
        note: str,
        timeout_s: Callable[[], float | None],
        failed: UpstreamFailed | None = None,
    ) -> AsyncIterator[SessionEvent]:
        """`call` answers alone as revision 0 (with failover), Final's reason led by `note`;
        if no answer comes, raises `failed` (else the last call's own failure)."""
        alone = Answer(call, 0)
        async for event in self._with_failover(alone, None, True, timeout_s):
            yield event
        if not alone.complete:
            assert alone.error is not None
            raise failed or UpstreamFailed(alone.call.tier, alone.error)
        reason = "; ".join([note, *alone.notes, f"answered by {alone.call.tier}"])
        for event in self._final(alone.call, alone.revision, reason):
            yield event

    def _refine_timeout_s(self) -> float:
        """What is left of the refinement's budget (which starts with its first call), within
        the client's deadline."""
        now = time.perf_counter()
        if self._refine_deadline is None:
            self._refine_deadline = now + self._refine_budget_s
        budget = max(0.001, self._refine_deadline - now)
        remaining = self._client_remaining_s()
        if remaining is None:
            return budget
        return max(0.001, min(budget, remaining - FINAL_MARGIN_S))

    def _final(
        self, call: TierCall, revision: int, reason: str, refinement: str | None = None
    ) -> list[SessionEvent]:
        """Cancels what still runs, then: its TierCallEnded events, the refinement's outcome
        (PROGRESSIVE) and Final naming `call`'s revision as the answer."""
        events: list[SessionEvent] = []
        for other in self._calls:
            other.cancel()
            events += self._relay.ended(other)
        if refinement is not None:
            events.append(RefinementSettled(refinement))
        events.append(final_event(self._calls, call, revision, reason, self._clock))
        return events
