"""One chat through the router as a state machine without I/O, in the manner of h11 or vLLM's
scheduler: it takes what happens (a tier call's chunk, failure or end, the first-token timer, the
client leaving) and returns what to do (session_actions.py: open a call on a tier with these
continuation tokens, read it, cancel that one, emit this event, fail the chat). Every decision
of a chat is made here; knows no gRPC, no asyncio and no clock (each input carries `now`, on the
SessionClock's perf_counter scale). The driver, chat_session.py, only does what it is told.

ROUTED and PINNED stream one tier as revision 0. PROGRESSIVE streams the draft tier as revision
0 and opens the refine tier once the draft's first delta is out (cascade gate: once the draft
ended unsure), so the refinement's prefill never delays the draft; the refinement then streams
as revision 1 replacing the draft; a draft confident enough for the gate is the answer and the
refinement is cancelled or never opened; a refinement that fails or runs over its budget leaves
the draft as the answer (the gate's verdict on a finished answer: progressive_verdicts.py). A
ROUTED chat with a fallback tier and a first-token timeout opens the fallback tier when the
first token is late; the first of the two to stream wins, the other is cancelled, and one that
fails or ends before its first chunk loses (first_token_race.py).

Failover: a failed call moves on to another replica of its tier while one is left untried,
then along the plan's `fallbacks` (each tier at most once). One that fails before its first
chunk is retried there unseen, in the same revision (on another tier only once, and only for
ROUTED chats and refinements). One that fails after streaming is continued by another replica of
its tier in the same revision (the replica prefills the prompt and the tokens already sent and
decodes on: the client sees one unbroken text); on another tier it goes on as a new revision
that replaces the broken one, its kept prefix computed against the text the client already has.
A call a tier refused for overload moves on only to a tier that, by the driver's live view
(`room`), would start it at once; else the refusal is relayed. Final.reason says what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tiermesh.v1 import router_pb2, tier_pb2

from services.common.errors import PROMPT_TOO_LONG
from services.router.chat_events import RefinementSettled, TierCallOpening
from services.router.chat_plan import ChatPlan, SessionClock, tier_request_id
from services.router.failover_target import (
    failover_target,
    longer_context_tier,
    who,
    widest_refusal,
)
from services.router.first_token_race import FirstTokenRace, RaceStep
from services.router.progressive_verdicts import (
    escalates_to,
    refined,
    settled_draft,
    tier_above,
    unsure,
)
from services.router.revision_stream import RevisionStream
from services.router.revisions import KeptPrefix, revision_end
from services.router.session_actions import (
    Action,
    CancelCall,
    Fail,
    OpenCall,
    ReadCall,
    StartTimer,
    StopTimer,
)
from services.router.session_calls import (
    CallState,
    TierError,
    describe,
    ended_event,
    final_event,
    refine_failure,
)
from services.router.session_deadlines import SessionDeadlines


class SessionCore:
    """One chat's decisions. Call start() once, then feed it what happens; each call returns the
    actions to carry out in order. `done` once Final or Fail was returned. Not thread-safe."""

    def __init__(
        self,
        plan: ChatPlan,
        replicas: Mapping[str, int],
        refine_budget_s: float,
        clock: SessionClock,
        deadline: float | None = None,
        call_timeout_s: float | None = None,
        call_id: Callable[[str, str], str] = tier_request_id,
    ) -> None:
        """`replicas`: how many replicas each tier has. `deadline`: the client's, on the clock's
        scale (None: none); tier calls then carry what is left of it, else `call_timeout_s`.
        `call_id(chat id, tier)` names a tier call."""
        self.plan = plan
        self.done = False
        self.calls: list[CallState] = []
        self._replicas = replicas
        self._deadlines = SessionDeadlines(deadline, call_timeout_s, refine_budget_s)
        self._clock = clock
        self._call_id = call_id
        self._phase = ""  # single, draft, refine, alone
        self._stream: RevisionStream | None = None
        self._race = FirstTokenRace()
        self._draft: RevisionStream | None = None
        self._refine: CallState | None = None
        self._alone_note = ""
        self._alone_failure: tuple[str, TierError] | None = None
        self._too_long: list[TierError] = []  # refusals of a prompt a tier cannot hold
        self._escalated: list[str] = []  # escalate: each refinement that was unsure too

    # -- inputs ------------------------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        """Opens the first call, then RouteDecision (so the two overlap)."""
        plan = self.plan
        out: list[Action] = []
        first = self._open(out, plan.tiers[0], self._deadlines.call_s(now))
        out += [router_pb2.ChatEvent(route=plan.decision), ReadCall(first.id)]
        if plan.mode != router_pb2.MODE_PROGRESSIVE:
            self._stream = RevisionStream(first, 0, None, plan.retry_first_token, False)
            self._phase = "single"
            if plan.fallback_tier and plan.first_token_timeout_s > 0:
                self._race.begin(first, plan.first_token_timeout_s)
                out.append(StartTimer(plan.first_token_timeout_s))
        elif len(plan.tiers) == 1:  # the draft tier was down: the refine tier answers alone
            self._stream = RevisionStream(first, 0, None, True, False)
            self._phase = "alone"
            self._alone_note = "no draft" if plan.escalation is None else f"{first.tier} only"
        else:
            cascade = plan.gate in ("cascade", "escalate")
            self._stream = RevisionStream(first, 0, None, False, False, False, not cascade)
            self._draft, self._phase = self._stream, "draft"
        return out

    def opened(self, call: int, endpoint: str) -> None:
        """The driver opened `call` on the replica `endpoint`."""
        self.calls[call].endpoint = endpoint

    def chunk(self, call: int, chunk: tier_pb2.GenerateChunk, now: float) -> list[Action]:
        state, s = self.calls[call], self._stream
        if not self._expects(state) or s is None:
            return []
        out = self._follow_race(self._race.streamed(state)) if self._race.running else []
        state.add(chunk)
        out += s.relay(chunk, self._clock, now)
        if s.open_refine_after_first and s.started:  # the draft's first delta is out
            s.open_refine_after_first = False
            self._refine = self._open(out, self.plan.tiers[-1], self._deadlines.refine_s(now))
        return out

    def ended(self, call: int, now: float) -> list[Action]:
        """The call's stream ended without an error."""
        state, s = self.calls[call], self._stream
        if not self._expects(state) or s is None:
            return []
        state.over = True
        out, lost = self._leave_race(state)
        if lost:
            return out
        out += s.complete_at_end(self._clock, now)
        out += self._report(state)
        finish = state.finish_reason or "stop"
        out.append(revision_end(s.revision, finish, state.usage, "", state.stop_sequence))
        return out + self._stream_over(now)

    def failed(
        self, call: int, error: TierError, now: float, room: frozenset[str] | None = None
    ) -> list[Action]:
        """The call failed. `room`: for a RESOURCE_EXHAUSTED refusal, the tiers with a replica
        not yet tried that would start a call at once (None: any tier may be tried)."""
        state, s = self.calls[call], self._stream
        if not self._expects(state) or s is None:
            return []
        state.over, state.error = True, error
        if error.reason == PROMPT_TOO_LONG:
            self._too_long.append(error)
        out, lost = self._leave_race(state)
        if lost:
            return out
        s.error = error
        out += self._report(state)
        if not s.failover:
            return out + self._give_up(s, now)
        return out + self._failover(s, state, error, now, room)

    def timer(self, now: float) -> list[Action]:
        """The first-token timer fired: the fallback tier races the late call."""
        if not self._race.timer_armed or self.plan.fallback_tier is None:
            return []
        out: list[Action] = []
        backup = self._open(out, self.plan.fallback_tier, self._deadlines.call_s(now))
        self._race.join(backup)
        return [*out, ReadCall(backup.id)]

    def client_left(self) -> list[Action]:
        """The client went away (or the chat ended): cancel every call still running."""
        self.done = True
        return [cancel for call in self.calls for cancel in self._cancel(call)]

    def _expects(self, call: CallState) -> bool:
        """Whether input from `call` means anything now: it runs and is being read."""
        if call.over or self.done:
            return False
        return call in self._race.racing if self._race.running else call is self._stream_call()

    def _stream_call(self) -> CallState | None:
        return self._stream.call if self._stream is not None else None

    # -- the first-token race ----------------------------------------------------------------

    def _leave_race(self, call: CallState) -> tuple[list[Action], bool]:
        """`call` ended or failed: the race's actions, and whether it lost (others race on)."""
        if not self._race.running:
            return [], False
        step = self._race.left(call)
        out = self._follow_race(step)
        if step.answer is call:  # it raced alone: its end is the answer's, as usual
            return out, False
        return out + self._report(call), True

    def _follow_race(self, step: RaceStep) -> list[Action]:
        """Stops the timer, cancels the losers and streams the answer's call, as `step` says."""
        out: list[Action] = [StopTimer()] if step.stop_timer else []
        for loser in step.cancel:
            out += self._cancel(loser) + self._report(loser)
        if step.answer is not None:
            assert self._stream is not None
            self._stream.call = step.answer
        return out

    def _give_up(self, s: RevisionStream, now: float) -> list[Action]:
        """The revision stream ends where it is (RevisionEnd if it broke after streaming)."""
        return s.broken_end() + self._stream_over(now)

    # -- failover --------------------------------------------------------------------------------

    def _failover(
        self,
        s: RevisionStream,
        call: CallState,
        error: TierError,
        now: float,
        room: frozenset[str] | None,
    ) -> list[Action]:
        """Where a failed call's revision goes on: another replica, the next tier, or nowhere."""
        if error.reason == PROMPT_TOO_LONG and not s.started:
            return self._past_short_context(s, call, error, now)
        target = failover_target(
            call, error, s.continuing, self.calls, self.plan.fallbacks, self._replicas, room
        )
        if target is None:
            return self._give_up(s, now)
        after, where = target.tier, target.where
        failed = f"{who(call, self._replicas)} failed"
        out: list[Action] = []
        if s.started and after == call.tier:  # same revision, on another replica
            s.notes.append(
                f"{failed} after {len(call.text)} characters ({describe(error)}); "
                f"{where} continued revision {s.revision}"
            )
            s.call = self._open(out, after, self._timeout_s(s, now), broken=call)
            s.call.revision, s.continuing, s.error = s.revision, True, None
            return [*out, ReadCall(s.call.id)]
        out += s.broken_end()
        if s.started:
            s.notes.append(
                f"{failed} after {len(call.text)} characters ({describe(error)}); "
                f"{where} went on as revision {s.revision + 1}"
            )
            s.previous, s.revision, s.started = call.text, s.revision + 1, False
        elif after == call.tier or s.retry_first:
            s.notes.append(
                f"{failed} before its first token ({describe(error)}); retried on {where}"
            )
            s.retry_first = s.retry_first and after == call.tier
        else:
            return out + self._stream_over(now)
        return self._reopen(s, after, out, now)

    def _past_short_context(
        self, s: RevisionStream, call: CallState, error: TierError, now: float
    ) -> list[Action]:
        """A tier whose model cannot hold the prompt: the chat moves on, unseen, to the next tier
        of its fallbacks not yet called (any chat but a pinned one), else ends with the failure
        of the tier that holds the most."""
        pinned = self.plan.mode == router_pb2.MODE_PINNED
        tier = longer_context_tier(self.calls, self.plan.fallbacks, pinned)
        if tier is None:
            return self._give_up(s, now)
        s.notes.append(f"{call.tier} cannot hold the prompt ({error.details}); moved to {tier}")
        return self._reopen(s, tier, [], now)

    # -- how a chat ends ---------------------------------------------------------------------------

    def _stream_over(self, now: float) -> list[Action]:
        """The current revision stream is complete, or failed with nowhere left to go."""
        s = self._stream
        assert s is not None
        if self._phase == "draft":
            return self._draft_over(s, now)
        if self._phase == "refine":
            return self._refine_over(s, now)
        if not s.complete:
            assert s.error is not None
            failure = self._alone_failure if self._phase == "alone" else None
            return self._fail(*(failure or (s.call.tier, s.error)))
        answered = f"answered by {s.call.tier}"
        if self._phase == "alone":
            reason = "; ".join([self._alone_note, *s.notes, answered])
        elif s.notes:
            reason = "; ".join([*s.notes, answered])
        else:
            reason = self._race.reason or answered
        if self.plan.note:  # what overload did to the route
            reason = f"{self.plan.note}; {reason}"
        return self._final(s.call, s.revision, reason, None, now)

    def _draft_over(self, draft: RevisionStream, now: float) -> list[Action]:
        call = draft.call
        refine_started = self._refine is not None
        if draft.complete and (
            settled := settled_draft(self.plan, call.tier, call.confidence, refine_started)
        ):
            return self._final(call, 0, settled.reason, settled.refinement, now)
        above = tier_above(self.plan, call.tier)
        out: list[Action] = []
        if self._refine is None:
            assert above is not None
            self._refine = self._open(out, above, self._deadlines.refine_s(now))
        refine = self._refine
        if not draft.started:  # the draft tier failed before any output: refine answers alone
            assert draft.error is not None
            self._alone_note = f"draft tier {call.tier} failed ({describe(draft.error)})"
            self._alone_failure = (call.tier, draft.error)
            self._stream, self._phase = RevisionStream(refine, 0, None, True, True), "alone"
        else:
            self._stream = RevisionStream(refine, 1, call.text, True, True)
            self._phase = "refine"
        return [*out, ReadCall(refine.id)]

    def _refine_over(self, s: RevisionStream, now: float) -> list[Action]:
        plan, draft = self.plan, self._draft
        assert draft is not None
        notes = [*self._escalated, *s.notes]
        if draft.error is not None:
            broken = f"after {len(draft.call.text)} characters ({describe(draft.error)})"
            notes = [f"draft by {draft.call.tier} failed {broken}", *notes]
        if s.complete:
            draft_unsure = unsure(plan, draft.call.tier, draft.call.confidence)
            if above := escalates_to(plan, s.call.tier, s.call.confidence):
                return self._escalate(s, above, draft_unsure, now)
            reason = refined(plan, s.call.tier, draft_unsure)
            return self._final(s.call, s.revision, "; ".join([*notes, reason]), "completed", now)
        assert s.error is not None
        if draft.complete:
            failure = "; ".join([*notes, refine_failure(s.call, s.error)])
            timed_out = s.error.code == "DEADLINE_EXCEEDED"
            return self._final(
                draft.call, draft.revision, failure, "timeout" if timed_out else "failed", now
            )
        assert draft.error is not None
        return self._fail(draft.call.tier, draft.error)

    def _escalate(
        self, s: RevisionStream, above: str, draft_unsure: str, now: float
    ) -> list[Action]:
        """An escalation's answer ended unsure too: it becomes the answer a failure falls back
        to, and the next tier up refines it as the next revision."""
        itself = unsure(self.plan, s.call.tier, s.call.confidence)
        refinement = refined(self.plan, s.call.tier, draft_unsure)
        self._escalated += [*s.notes, f"{refinement}, itself unsure ({itself})"]
        self._draft = s
        out: list[Action] = []
        nxt = self._open(out, above, self._deadlines.refine_s(now))
        self._refine = nxt
        self._stream = RevisionStream(nxt, s.revision + 1, s.call.text, True, True)
        return [*out, ReadCall(nxt.id)]

    def _final(
        self, call: CallState, revision: int, reason: str, refinement: str | None, now: float
    ) -> list[Action]:
        """Cancels what still runs, then: its TierCallEnded events, the refinement's outcome
        (PROGRESSIVE) and Final naming `call`'s revision as the answer."""
        out: list[Action] = []
        for other in self.calls:
            out += self._cancel(other) + self._report(other)
        if refinement is not None:
            out.append(RefinementSettled(refinement))
        out.append(final_event(self.calls, call, revision, reason, self._clock, now))
        self.done = True
        return out

    def _fail(self, tier: str, error: TierError) -> list[Action]:
        """Ends the chat with `tier`'s failure; a prompt no tier tried could hold (a chat not
        pinned) names the largest context among them."""
        self.done = True
        pinned = self.plan.mode == router_pb2.MODE_PINNED
        if error.reason == PROMPT_TOO_LONG and self._too_long and not pinned:
            tier, error = widest_refusal(self._too_long, self.calls)
        return [Fail(tier, error)]

    # -- calls -----------------------------------------------------------------------------------

    def _open(
        self,
        out: list[Action],
        tier: str,
        timeout_s: float | None,
        broken: CallState | None = None,
    ) -> CallState:
        """A new call on `tier` (with `broken`, one continuing its answer), announced in `out`."""
        request_id = self._call_id(self.plan.request_id, tier)
        call = CallState(len(self.calls), tier, request_id, timeout_s, self.plan.priority)
        continuation = call.continue_from(broken) if broken is not None else None
        self.calls.append(call)
        out.append(OpenCall(call.id, TierCallOpening(tier, request_id), timeout_s, continuation))
        return call

    def _reopen(self, s: RevisionStream, tier: str, out: list[Action], now: float) -> list[Action]:
        """`s` goes on with a new call on `tier`, keeping the text the client has (if any)."""
        s.kept = KeptPrefix(s.previous) if s.previous is not None else None
        s.continuing, s.error, s.held = False, None, []
        s.call = self._open(out, tier, self._timeout_s(s, now))
        return [*out, ReadCall(s.call.id)]

    def _timeout_s(self, s: RevisionStream, now: float) -> float | None:
        """What a new call of `s` may take: the refinement's budget or the call's."""
        return self._deadlines.refine_s(now) if s.refine_clock else self._deadlines.call_s(now)

    def _cancel(self, call: CallState) -> list[Action]:
        if call.over:
            return []
        call.over = call.cancelled = True
        return [CancelCall(call.id)]

    def _report(self, call: CallState) -> list[Action]:
        """The call's TierCallEnded, once: by its failure, its finish, or else as cancelled."""
        if call.reported:
            return []
        call.reported = True
        return [ended_event(call)]
