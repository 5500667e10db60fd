"""One chat through the router: starts the tier calls of a plan and turns them into revisions.

ROUTED and PINNED stream one tier as revision 0. PROGRESSIVE starts the draft and refine tiers
together, streams the draft as revision 0, then the refinement as revision 1 replacing it; if
the refinement fails or runs over its budget, the draft is the answer. Every upstream call still
running when the session ends (client gone, error, deadline) is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from tiermesh.v1 import common_pb2, router_pb2, tier_pb2

from services.router.chat_telemetry import ChatTelemetry
from services.router.policy import RouteChoice
from services.router.revisions import KeptPrefix, delta, revision_end, revision_start
from services.router.tier_calls import TierCall, TierChannels

FINAL_MARGIN_S = 0.05  # time kept back from the client's deadline to send Final after a refine


class UpstreamFailed(Exception):
    """A tier failed and no other answer is left; relayed to the client with the tier's code."""

    def __init__(self, tier: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"tier {tier}: {error.details()}")
        self.code: grpc.StatusCode = error.code()
        self.details = f"tier {tier}: {error.details()}"


@dataclass(frozen=True)
class ChatPlan:
    """What the router decided to run for one chat."""

    request_id: str
    mode: int  # router_pb2.Mode
    tiers: tuple[str, ...]  # in revision order: one tier, or (draft, refine)
    generate: tier_pb2.GenerateRequest  # the tier request, without request_id
    decision: router_pb2.RouteDecision
    fallback_tier: str | None = None  # ROUTED/PINNED: started if the first token is late
    first_token_timeout_s: float = 0.0  # 0 = no timeout fallback
    gate: str = "always"  # PROGRESSIVE: "always", "race" or "cascade"
    min_confidence: float = 0.0  # PROGRESSIVE: a draft at least this confident is kept
    choice: RouteChoice | None = None  # the policy's view of the request (for learning)


@dataclass
class SessionResult:
    """What the chat produced, for policies that learn from it."""

    answer_tier: str = ""
    draft_text: str | None = None  # PROGRESSIVE: the draft, complete
    refined_text: str | None = None  # PROGRESSIVE: the refinement, complete


@dataclass
class RevisionOutcome:
    started: bool = False  # RevisionStart was sent
    complete: bool = False  # the tier finished normally
    error: grpc.aio.AioRpcError | None = None


@dataclass
class SessionClock:
    """Milliseconds since the router received the request, and the marks Final reports."""

    start: float = field(default_factory=time.perf_counter)
    route_ms: float = 0.0
    ttft_ms: float = 0.0
    first_draft_ms: float = 0.0

    def ms(self) -> float:
        return (time.perf_counter() - self.start) * 1000


class ChatSession:
    def __init__(
        self,
        plan: ChatPlan,
        channels: TierChannels,
        refine_budget_s: float,
        time_remaining_s: float | None,
        clock: SessionClock,
        telemetry: ChatTelemetry,
    ) -> None:
        self._telemetry = telemetry
        self._plan = plan
        self._channels = channels
        self._refine_budget_s = refine_budget_s
        self._deadline = None if time_remaining_s is None else clock.start + time_remaining_s
        self._clock = clock
        self._calls: list[TierCall] = []
        self.result = SessionResult()

    def _remaining_s(self) -> float | None:
        return None if self._deadline is None else max(0.001, self._deadline - time.perf_counter())

    def _start(self, tier: str, timeout_s: float | None) -> TierCall:
        request = tier_pb2.GenerateRequest()
        request.CopyFrom(self._plan.generate)
        request.request_id = f"{self._plan.request_id}/{tier}"
        span = self._telemetry.tier_call(tier, request.request_id)
        call = TierCall(self._channels, tier, request, timeout_s, span)
        self._calls.append(call)
        return call

    async def events(self) -> AsyncIterator[router_pb2.ChatEvent]:
        """The chat's events, RouteDecision first and Final last; raises UpstreamFailed."""
        try:
            yield router_pb2.ChatEvent(route=self._plan.decision)
            if self._plan.mode == router_pb2.MODE_PROGRESSIVE:
                async for event in self._progressive():
                    yield event
            else:
                async for event in self._single():
                    yield event
        finally:
            for call in self._calls:
                call.cancel()

    async def _single(self) -> AsyncIterator[router_pb2.ChatEvent]:
        call = self._start(self._plan.tiers[0], self._remaining_s())
        chunks = call.chunks()
        reason = f"answered by {call.tier}"
        plan = self._plan
        if plan.fallback_tier and plan.first_token_timeout_s > 0:
            call, chunks, raced = await self._first_token_race(call, chunks)
            if raced:
                reason = (
                    f"no first token from {plan.tiers[0]} within "
                    f"{plan.first_token_timeout_s * 1000:.0f} ms; answered by {call.tier}"
                )
        outcome = RevisionOutcome()
        async for event in self._stream_revision(call, 0, None, outcome, chunks):
            yield event
        if not outcome.complete:
            assert outcome.error is not None
            raise UpstreamFailed(call.tier, outcome.error)
        yield self._final(call, 0, reason)

    async def _first_token_race(
        self, call: TierCall, chunks: AsyncIterator[tier_pb2.GenerateChunk]
    ) -> tuple[TierCall, AsyncIterator[tier_pb2.GenerateChunk], bool]:
        """Timeout fallback: if `call` has no first chunk within the plan's timeout, start the
        fallback tier too; whichever streams first wins and the other is cancelled."""
        first = asyncio.ensure_future(anext(chunks))
        done, _ = await asyncio.wait({first}, timeout=self._plan.first_token_timeout_s)
        if done:
            return call, _prepend(first, chunks), False
        assert self._plan.fallback_tier is not None
        backup = self._start(self._plan.fallback_tier, self._remaining_s())
        backup_chunks = backup.chunks()
        second = asyncio.ensure_future(anext(backup_chunks))
        done, _ = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
        if first in done and not first.exception():
            second.cancel()
            backup.cancel()
            return call, _prepend(first, chunks), False
        first.cancel()
        call.cancel()
        return backup, _prepend(second, backup_chunks), True

    async def _progressive(self) -> AsyncIterator[router_pb2.ChatEvent]:
        draft_tier, refine_tier = self._plan.tiers
        gate = self._plan.gate
        draft = self._start(draft_tier, self._remaining_s())
        refine = None if gate == "cascade" else self._start(refine_tier, self._refine_timeout_s())
        first = RevisionOutcome()
        async for event in self._stream_revision(draft, 0, None, first):
            yield event
        if first.complete:
            self.result.draft_text = draft.text
        if first.complete and gate != "always":
            confidence = draft.confidence
            if confidence >= self._plan.min_confidence:
                verdict = "cancelled" if refine is not None else "skipped"
                yield self._final(
                    draft,
                    0,
                    f"draft confident ({confidence:.2f} >= {self._plan.min_confidence:.2f}); "
                    f"refinement {verdict}",
                    verdict,
                )
                return
        if refine is None:
            refine = self._start(refine_tier, self._refine_timeout_s())
        if not first.started:  # the draft tier failed before any output: refine answers alone
            assert first.error is not None
            alone = RevisionOutcome()
            async for event in self._stream_revision(refine, 0, None, alone):
                yield event
            if not alone.complete:
                raise UpstreamFailed(draft_tier, first.error)
            reason = f"draft tier {draft_tier} failed ({_describe(first.error)}); answered by "
            yield self._final(refine, 0, reason + refine_tier)
            return
        second = RevisionOutcome()
        async for event in self._stream_revision(refine, 1, draft.text, second):
            yield event
        if second.complete:
            self.result.refined_text = refine.text
            reason = f"refined by {refine_tier}"
            if gate != "always":
                reason += (
                    f" (draft unsure: {draft.confidence:.2f} < {self._plan.min_confidence:.2f})"
                )
            yield self._final(refine, 1, reason, "completed")
        elif first.complete:
            assert second.error is not None
            timed_out = second.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            outcome = "timeout" if timed_out else "failed"
            yield self._final(draft, 0, self._refine_failure(refine, second.error), outcome)
        else:
            assert first.error is not None
            raise UpstreamFailed(draft_tier, first.error)

    def _refine_timeout_s(self) -> float:
        remaining = self._remaining_s()
        if remaining is None:
            return self._refine_budget_s
        return max(0.001, min(self._refine_budget_s, remaining - FINAL_MARGIN_S))

    def _refine_failure(self, call: TierCall, error: grpc.aio.AioRpcError) -> str:
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and call.timeout_s is not None:
            return (
                f"refinement by {call.tier} exceeded its {call.timeout_s * 1000:.0f} ms budget; "
                "draft kept"
            )
        return f"refinement by {call.tier} failed ({_describe(error)}); draft kept"

    async def _stream_revision(
        self,
        call: TierCall,
        revision: int,
        previous: str | None,
        outcome: RevisionOutcome,
        chunks: AsyncIterator[tier_pb2.GenerateChunk] | None = None,
    ) -> AsyncIterator[router_pb2.ChatEvent]:
        """Relays one tier call as a revision. Nothing is sent if the call fails before its first
        chunk; a replacing revision holds its text until its kept prefix is known."""
        kept = KeptPrefix(previous) if previous is not None else None
        held: list[tier_pb2.GenerateChunk] = []
        replaces = revision - 1 if previous is not None else None
        try:
            async for chunk in chunks if chunks is not None else call.chunks():
                if outcome.started:
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
            if not outcome.started:
                keep = kept.at_end() if kept is not None else 0
                yield self._begin(call, revision, replaces, keep, outcome)
            outcome.complete = True
            self._telemetry.revision_ended(revision, call.finish_reason or "stop")
            yield revision_end(revision, call.finish_reason or "stop", call.usage)
        except grpc.aio.AioRpcError as e:
            outcome.error = e
            if outcome.started:
                timed_out = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                finish = "timeout" if timed_out else "error"
                self._telemetry.revision_ended(revision, finish, _describe(e))
                yield revision_end(revision, finish, call.usage, _describe(e))

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
        self._telemetry.revision_started(revision, call.tier, keep)
        return revision_start(revision, call.tier, replaces, keep)

    def _final(
        self, call: TierCall, revision: int, reason: str, refinement: str | None = None
    ) -> router_pb2.ChatEvent:
        for other in self._calls:
            other.cancel()
        self.result.answer_tier = call.tier
        usage = []
        for c in self._calls:
            tier_usage = router_pb2.TierUsage(
                tier=c.tier, usage=c.usage or common_pb2.Usage(), cancelled=c.cancelled
            )
            if c.revision is not None:
                tier_usage.revision = c.revision
            usage.append(tier_usage)
        timings = router_pb2.Timings(
            route_ms=self._clock.route_ms,
            ttft_ms=self._clock.ttft_ms,
            time_to_first_draft_ms=self._clock.first_draft_ms,
            time_to_final_ms=self._clock.ms(),
        )
        final = router_pb2.Final(
            revision=revision,
            tier=call.tier,
            text=call.text,
            reason=reason,
            usage=usage,
            timings=timings,
            revisions=max((c.revision or 0) for c in self._calls if c.revision is not None) + 1,
        )
        self._telemetry.final(final, refinement)
        return router_pb2.ChatEvent(final=final)


async def _prepend(
    first: asyncio.Future[tier_pb2.GenerateChunk], rest: AsyncIterator[tier_pb2.GenerateChunk]
) -> AsyncIterator[tier_pb2.GenerateChunk]:
    """The chunk `first` resolves to, then the rest of the stream. A stream that ended before
    any chunk simply ends; a failed one raises its error."""
    try:
        yield await first
    except StopAsyncIteration:
        return
    async for chunk in rest:
        yield chunk


def _describe(error: grpc.aio.AioRpcError) -> str:
    return f"{error.code().name}: {error.details()}"
