"""The router's chat session core (services/router/session_core.py) as tables of scenarios:
plain inputs in (a call's chunk, end or failure, the first-token timer, the client leaving, each
at a time), the actions out, written as a transcript. No gRPC, no event loop, no tier.

Transcript lines: `open#N tier` (`+K tokens` when it continues a broken call, `in S s` its
timeout), `read#N`, `cancel#N`, `timer`/`stop timer`, `route`, `start rR` (`replaces rP keeps
C`), `rR: 'text'`, `end rR finish`, `ended#N CODE`, `refinement OUTCOME`, `final rR tier:
reason`, `fail tier CODE`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from tiermesh.v1 import common_pb2, router_pb2, tier_pb2

from services.router.chat_events import RefinementSettled, TierCallEnded
from services.router.chat_plan import ChatPlan, SessionClock
from services.router.escalation import Escalation
from services.router.session_actions import (
    Action,
    CancelCall,
    Fail,
    OpenCall,
    ReadCall,
    StartTimer,
    StopTimer,
)
from services.router.session_calls import TierError
from services.router.session_core import SessionCore

ROUTED, PINNED, PROGRESSIVE = (
    router_pb2.MODE_ROUTED,
    router_pb2.MODE_PINNED,
    router_pb2.MODE_PROGRESSIVE,
)


def plan(
    mode: router_pb2.Mode,
    tiers: tuple[str, ...],
    fallbacks: tuple[str, ...] = (),
    *,
    gate: str = "always",
    min_confidence: float = 0.5,
    first_token_timeout_s: float = 0.0,
) -> ChatPlan:
    """A plan as chat_planning makes them; gate "escalate" with the default thresholds (small
    0.945, medium 0.99)."""
    decision = router_pb2.RouteDecision(request_id="c", mode=mode, tiers=tiers)
    return ChatPlan(
        "c",
        mode,
        tiers,
        tier_pb2.GenerateRequest(max_tokens=16),
        decision,
        fallback_tier=fallbacks[0] if fallbacks and first_token_timeout_s else None,
        first_token_timeout_s=first_token_timeout_s,
        fallbacks=fallbacks,
        retry_first_token=mode == ROUTED,
        gate=gate,
        min_confidence=min_confidence,
        escalation=Escalation() if gate == "escalate" else None,
    )


# inputs: (at_s, what, call, argument)
def chunk(at: float, call: int, text: str, last: bool = False, logprob: float = -0.1) -> tuple:
    return (at, "chunk", call, (text, last, logprob))


def end(at: float, call: int) -> tuple:
    return (at, "end", call, None)


def fail(at: float, call: int, code: str, room: frozenset[str] | None = None) -> tuple:
    return (at, "fail", call, (code, room))


def too_long(at: float, call: int, limit: int) -> tuple:
    """The tier cannot hold the prompt (90 tokens) within its limit."""
    return (at, "too_long", call, limit)


def timer(at: float) -> tuple:
    return (at, "timer", None, None)


def left(at: float) -> tuple:
    return (at, "left", None, None)


@dataclass
class Run:
    """Drives one core, naming replicas `<tier>-<n>` in the order calls reach a tier."""

    core: SessionCore
    lines: list[str] = field(default_factory=list)
    tokens: dict[int, int] = field(default_factory=dict)  # token ids handed out, per call
    opens: list[OpenCall] = field(default_factory=list)
    last_fail: Fail | None = None

    def apply(self, actions: list[Action]) -> None:
        for action in actions:
            self.lines.append(self.line(action))

    def line(self, action: Action) -> str:
        core = self.core
        if isinstance(action, OpenCall):
            self.opens.append(action)
            tier = action.opening.tier
            tried = {c.endpoint for c in core.calls if c.tier == tier and c.endpoint}
            core.opened(action.call, f"{tier}-{len(tried)}")
            cont = action.continuation
            more = f" +{len(cont.token_ids)} tokens" if cont is not None else ""
            timeout = f" in {action.timeout_s:g} s" if action.timeout_s is not None else ""
            return f"open#{action.call} {tier}{more}{timeout}"
        if isinstance(action, ReadCall):
            return f"read#{action.call}"
        if isinstance(action, CancelCall):
            return f"cancel#{action.call}"
        if isinstance(action, StartTimer):
            return "timer"
        if isinstance(action, StopTimer):
            return "stop timer"
        if isinstance(action, Fail):
            self.last_fail = action
            return f"fail {action.tier} {action.error.code}"
        if isinstance(action, TierCallEnded):
            call = next(c.id for c in core.calls if c.request_id == action.request_id)
            return f"ended#{call} {action.code}"
        if isinstance(action, RefinementSettled):
            return f"refinement {action.outcome}"
        return self.wire(action)

    @staticmethod
    def wire(event: router_pb2.ChatEvent) -> str:
        kind = event.WhichOneof("event")
        if kind == "route":
            return "route"
        if kind == "revision_start":
            s = event.revision_start
            if s.HasField("replaces"):
                return f"start r{s.revision} replaces r{s.replaces} keeps {s.kept_prefix_chars}"
            return f"start r{s.revision}"
        if kind == "delta":
            return f"r{event.delta.revision}: {event.delta.text!r}"
        if kind == "revision_end":
            return f"end r{event.revision_end.revision} {event.revision_end.finish_reason}"
        assert kind == "final"
        f = event.final
        return f"final r{f.revision} {f.tier}: {f.reason}"

    def feed(self, at: float, what: str, call: int | None, arg: object) -> None:
        core, now = self.core, 100.0 + at
        if what == "chunk":
            assert call is not None
            text, last, logprob = arg  # type: ignore[misc]
            first = self.tokens.get(call, 0)
            self.tokens[call] = first + 1
            message = tier_pb2.GenerateChunk(text=text, token_ids=[first], logprobs=[logprob])
            if last:
                message.finish_reason = "stop"
                message.usage.CopyFrom(common_pb2.Usage(prompt_tokens=3, completion_tokens=1))
            self.apply(core.chunk(call, message, now))
        elif what == "end":
            assert call is not None
            self.apply(core.ended(call, now))
        elif what == "fail":
            assert call is not None
            code, room = arg  # type: ignore[misc]
            self.apply(core.failed(call, TierError(code, "boom"), now, room))
        elif what == "too_long":
            assert isinstance(arg, int) and call is not None
            details = f"prompt: 90 tokens exceeds this tier's limit of {arg} tokens"
            metadata = {"prompt_tokens": "90", "limit_tokens": str(arg)}
            error = TierError(
                "INVALID_ARGUMENT", details, reason="PROMPT_TOO_LONG", metadata=metadata
            )
            self.apply(core.failed(call, error, now))
            if self.lines[-1].startswith("fail"):
                self.lines.append(core_failure_details(self.last_fail))
        elif what == "timer":
            self.apply(core.timer(now))
        else:
            self.apply(core.client_left())


def core_failure_details(fail: Fail | None) -> str:
    assert fail is not None
    return f"  {fail.error.details}"


def run(
    chat: ChatPlan,
    inputs: list[tuple],
    replicas: dict[str, int] | None = None,
    deadline_s: float | None = None,
    call_timeout_s: float | None = 30.0,
) -> Run:
    counts: dict[str, int] = {}

    def call_id(chat_id: str, tier: str) -> str:
        counts[tier] = counts.get(tier, 0) + 1
        return f"{chat_id}/{tier}/{counts[tier]}"

    clock = SessionClock(start=100.0)
    deadline = None if deadline_s is None else 100.0 + deadline_s
    core = SessionCore(chat, replicas or {}, 1.0, clock, deadline, call_timeout_s, call_id)
    driven = Run(core)
    driven.apply(core.start(100.0))
    for item in inputs:
        driven.feed(*item)
    return driven


SURE, UNSURE = -0.001, -0.1  # a token's log-probability: confidence 1.00 and 0.90
DRAFT = [chunk(0.01, 0, "The price"), chunk(0.02, 0, " is $5", last=True), end(0.03, 0)]
DRAFT_LINES = [
    "open#0 small in 30 s",
    "route",
    "read#0",
    "start r0",
    "r0: 'The price'",
    "open#1 large in 1 s",
    "r0: ' is $5'",
    "ended#0 OK",
    "end r0 stop",
    "read#1",
]
REFINED = [chunk(0.5, 1, "Sorry"), fail(0.5, 1, "UNAVAILABLE")]  # the refinement breaks
BROKEN_REFINEMENT = [
    "start r1 replaces r0 keeps 0",
    "r1: 'Sorry'",
    "ended#1 UNAVAILABLE",
    "end r1 error",
]

SCENARIOS = {
    "routed: one revision": (
        plan(ROUTED, ("small",), ("medium",)),
        {},
        [chunk(0.01, 0, "Hi"), chunk(0.02, 0, " there", last=True), end(0.03, 0)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Hi'", "r0: ' there'"]
        + ["ended#0 OK", "end r0 stop", "final r0 small: answered by small"],
    ),
    "before the first token: another replica, unseen": (
        plan(ROUTED, ("small",), ("medium",)),
        {"small": 2},
        [fail(0.01, 0, "UNAVAILABLE"), chunk(0.1, 1, "Hi", last=True), end(0.1, 1)],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 UNAVAILABLE"]
        + ["open#1 small in 30 s", "read#1", "start r0", "r0: 'Hi'", "ended#1 OK", "end r0 stop"]
        + [
            "final r0 small: small (small-0) failed before its first token (UNAVAILABLE: boom); "
            "retried on another small replica; answered by small"
        ],
    ),
    "before the first token: the next tier once, then the failure": (
        plan(ROUTED, ("small",), ("medium", "large")),
        {},
        [fail(0.01, 0, "UNAVAILABLE"), fail(0.02, 1, "INTERNAL")],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 UNAVAILABLE"]
        + ["open#1 medium in 30 s", "read#1", "ended#1 INTERNAL", "fail medium INTERNAL"],
    ),
    "pinned: no other tier before the first token": (
        plan(PINNED, ("small",), ("medium",)),
        {},
        [fail(0.01, 0, "UNAVAILABLE")],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 UNAVAILABLE"]
        + ["fail small UNAVAILABLE"],
    ),
    "a prompt a tier cannot hold moves on unseen, past every tier too short": (
        plan(ROUTED, ("small",), ("medium", "large")),
        {"small": 2},
        [too_long(0.01, 0, 64), too_long(0.02, 1, 80), chunk(0.1, 2, "Hi", last=True), end(0.1, 2)],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 INVALID_ARGUMENT"]
        + ["open#1 medium in 30 s", "read#1", "ended#1 INVALID_ARGUMENT", "open#2 large in 30 s"]
        + ["read#2", "start r0", "r0: 'Hi'", "ended#2 OK", "end r0 stop"]
        + [
            "final r0 large: small cannot hold the prompt (prompt: 90 tokens exceeds this tier's "
            "limit of 64 tokens); moved to medium; medium cannot hold the prompt (prompt: 90 "
            "tokens exceeds this tier's limit of 80 tokens); moved to large; answered by large"
        ],
    ),
    "a prompt no tier holds: refused naming the largest context": (
        plan(ROUTED, ("small",), ("large", "medium")),
        {},
        [too_long(0.01, 0, 64), too_long(0.02, 1, 200), too_long(0.03, 2, 80)],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 INVALID_ARGUMENT"]
        + ["open#1 large in 30 s", "read#1", "ended#1 INVALID_ARGUMENT", "open#2 medium in 30 s"]
        + ["read#2", "ended#2 INVALID_ARGUMENT", "fail large INVALID_ARGUMENT"]
        + [
            "  prompt: 90 tokens exceeds the largest context of the tiers that could take it "
            "(200 tokens)"
        ],
    ),
    "pinned: a prompt its tier cannot hold is refused": (
        plan(PINNED, ("small",), ("medium",)),
        {},
        [too_long(0.01, 0, 64)],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 INVALID_ARGUMENT"]
        + [
            "fail small INVALID_ARGUMENT",
            "  prompt: 90 tokens exceeds this tier's limit of 64 tokens",
        ],
    ),
    "bad input is the same anywhere: relayed": (
        plan(ROUTED, ("small",), ("medium",)),
        {"small": 2},
        [fail(0.01, 0, "INVALID_ARGUMENT")],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 INVALID_ARGUMENT"]
        + ["fail small INVALID_ARGUMENT"],
    ),
    "refused for overload with no tier that has room: relayed": (
        plan(ROUTED, ("small",), ("medium",)),
        {},
        [fail(0.01, 0, "RESOURCE_EXHAUSTED", room=frozenset({"small"}))],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 RESOURCE_EXHAUSTED"]
        + ["fail small RESOURCE_EXHAUSTED"],
    ),
    "refused for overload: on to a tier with room": (
        plan(ROUTED, ("small",), ("medium", "large")),
        {},
        [fail(0.01, 0, "RESOURCE_EXHAUSTED", room=frozenset({"large"}))],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 RESOURCE_EXHAUSTED"]
        + ["open#1 large in 30 s", "read#1"],
    ),
    "after the first token: another replica continues the same revision": (
        plan(ROUTED, ("small",), ("medium",)),
        {"small": 2},
        [chunk(0.01, 0, "The"), chunk(0.02, 0, " price"), fail(0.03, 0, "UNAVAILABLE")]
        + [chunk(0.1, 1, " is $5", last=True), end(0.1, 1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'The'", "r0: ' price'"]
        + ["ended#0 UNAVAILABLE", "open#1 small +2 tokens in 30 s", "read#1", "r0: ' is $5'"]
        + ["ended#1 OK", "end r0 stop"]
        + [
            "final r0 small: small (small-0) failed after 9 characters (UNAVAILABLE: boom); "
            "another small replica continued revision 0; answered by small"
        ],
    ),
    "after the first token: the next tier as a new revision, its kept prefix honest": (
        plan(ROUTED, ("small",), ("medium",)),
        {},
        [chunk(0.01, 0, "The"), chunk(0.02, 0, " price"), fail(0.03, 0, "UNAVAILABLE")]
        + [chunk(0.1, 1, "The price"), chunk(0.1, 1, " is $6", last=True), end(0.1, 1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'The'", "r0: ' price'"]
        + ["ended#0 UNAVAILABLE", "end r0 error", "open#1 medium in 30 s", "read#1"]
        + ["start r1 replaces r0 keeps 9", "r1: 'The price'", "r1: ' is $6'", "ended#1 OK"]
        + ["end r1 stop"]
        + [
            "final r1 medium: small failed after 9 characters (UNAVAILABLE: boom); "
            "medium went on as revision 1; answered by medium"
        ],
    ),
    "a continuation refused by a replica of another model: on to the next tier": (
        plan(ROUTED, ("small",), ("medium",)),
        {"small": 2},
        [chunk(0.01, 0, "The"), fail(0.02, 0, "UNAVAILABLE"), fail(0.03, 1, "FAILED_PRECONDITION")]
        + [chunk(0.1, 2, "The end", last=True), end(0.1, 2)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'The'"]
        + ["ended#0 UNAVAILABLE", "open#1 small +1 tokens in 30 s", "read#1"]
        + ["ended#1 FAILED_PRECONDITION", "end r0 error", "open#2 medium in 30 s", "read#2"]
        + ["start r1 replaces r0 keeps 3", "r1: 'The end'", "ended#2 OK", "end r1 stop"]
        + [
            "final r1 medium: small (small-0) failed after 3 characters (UNAVAILABLE: boom); "
            "another small replica continued revision 0; small (small-1) failed after 3 "
            "characters (FAILED_PRECONDITION: boom); medium went on as revision 1; "
            "answered by medium"
        ],
    ),
    "progressive: the refinement replaces the draft": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [*DRAFT, chunk(0.5, 1, "The price is $6", last=True), end(0.6, 1)],
        DRAFT_LINES
        + ["start r1 replaces r0 keeps 14", "r1: 'The price is $6'", "ended#1 OK"]
        + ["end r1 stop", "refinement completed", "final r1 large: refined by large"],
    ),
    "progressive: a refinement that only repeats the draft so far is held, then fails": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [*DRAFT, chunk(0.5, 1, "The"), fail(0.6, 1, "UNAVAILABLE")],
        DRAFT_LINES
        + ["ended#1 UNAVAILABLE", "refinement failed"]
        + ["final r0 small: refinement by large failed (UNAVAILABLE: boom); draft kept"],
    ),
    "progressive: refinement broken after streaming, no tier left: the draft is kept": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [*DRAFT, *REFINED],
        DRAFT_LINES
        + BROKEN_REFINEMENT
        + ["refinement failed"]
        + ["final r0 small: refinement by large failed (UNAVAILABLE: boom); draft kept"],
    ),
    "progressive: refinement broken after streaming goes on as revision 2": (
        plan(PROGRESSIVE, ("small", "large"), ("medium",)),
        {},
        [*DRAFT, *REFINED, chunk(0.7, 2, "Sorry, $6", last=True), end(0.7, 2)],
        DRAFT_LINES
        + BROKEN_REFINEMENT
        + ["open#2 medium in 0.51 s", "read#2", "start r2 replaces r1 keeps 5"]
        + ["r2: 'Sorry, $6'", "ended#2 OK", "end r2 stop", "refinement completed"]
        + [
            "final r2 medium: large failed after 5 characters (UNAVAILABLE: boom); "
            "medium went on as revision 2; refined by medium"
        ],
    ),
    "progressive: refinement past its budget ends as timeout; the draft is kept": (
        plan(PROGRESSIVE, ("small", "large"), ("medium",)),
        {},
        [*DRAFT, chunk(0.5, 1, "Sorry"), fail(1.01, 1, "DEADLINE_EXCEEDED")],
        DRAFT_LINES
        + ["start r1 replaces r0 keeps 0", "r1: 'Sorry'", "ended#1 DEADLINE_EXCEEDED"]
        + ["end r1 timeout", "refinement timeout"]
        + ["final r0 small: refinement by large exceeded its 1000 ms budget; draft kept"],
    ),
    "progressive: the draft fails before any output, the refinement answers alone": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [fail(0.01, 0, "UNAVAILABLE"), chunk(0.2, 1, "Hi", last=True), end(0.2, 1)],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 UNAVAILABLE"]
        + ["open#1 large in 1 s", "read#1", "start r0", "r0: 'Hi'", "ended#1 OK", "end r0 stop"]
        + ["final r0 large: draft tier small failed (UNAVAILABLE: boom); answered by large"],
    ),
    "progressive: both broken, the draft tier's failure is relayed": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [fail(0.01, 0, "UNAVAILABLE"), fail(0.2, 1, "INTERNAL")],
        ["open#0 small in 30 s", "route", "read#0", "ended#0 UNAVAILABLE"]
        + ["open#1 large in 1 s", "read#1", "ended#1 INTERNAL", "fail small UNAVAILABLE"],
    ),
    "progressive: the draft broken mid-answer, the refinement replaces it": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [chunk(0.01, 0, "The"), fail(0.02, 0, "UNAVAILABLE")]
        + [chunk(0.3, 1, "The price", last=True), end(0.3, 1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'The'"]
        + ["open#1 large in 1 s", "ended#0 UNAVAILABLE", "end r0 error", "read#1"]
        + ["start r1 replaces r0 keeps 3", "r1: 'The price'", "ended#1 OK", "end r1 stop"]
        + [
            "refinement completed",
            "final r1 large: draft by small failed after 3 characters (UNAVAILABLE: boom); "
            "refined by large",
        ],
    ),
    "race gate: a confident draft cancels the refinement": (
        plan(PROGRESSIVE, ("small", "large"), gate="race"),
        {},
        [chunk(0.01, 0, "Yes", last=True), end(0.02, 0)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'"]
        + ["open#1 large in 1 s", "ended#0 OK", "end r0 stop", "cancel#1", "ended#1 CANCELLED"]
        + ["refinement cancelled"]
        + ["final r0 small: draft confident (0.90 >= 0.50); refinement cancelled"],
    ),
    "cascade gate: a confident draft never opens the refinement": (
        plan(PROGRESSIVE, ("small", "large"), gate="cascade"),
        {},
        [chunk(0.01, 0, "Yes", last=True), end(0.02, 0)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "refinement skipped"]
        + ["final r0 small: draft confident (0.90 >= 0.50); refinement skipped"],
    ),
    "cascade gate: an unsure draft is refined once it ended": (
        plan(PROGRESSIVE, ("small", "large"), gate="cascade"),
        {},
        [chunk(0.01, 0, "Yes", last=True, logprob=-2.0), end(0.02, 0)]
        + [chunk(0.3, 1, "No", last=True), end(0.3, 1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "open#1 large in 1 s", "read#1", "start r1 replaces r0 keeps 0"]
        + ["r1: 'No'", "ended#1 OK", "end r1 stop", "refinement completed"]
        + ["final r1 large: refined by large (draft unsure: 0.14 < 0.50)"],
    ),
    "escalate gate: a confident small answer ends the chat": (
        plan(PROGRESSIVE, ("small", "medium", "large"), ("large",), gate="escalate"),
        {},
        [chunk(0.01, 0, "Yes", last=True, logprob=SURE), end(0.02, 0)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "refinement skipped"]
        + ["final r0 small: draft confident (1.00 >= 0.945); refinement skipped"],
    ),
    "escalate gate: an unsure small answer goes on to medium, which is sure": (
        plan(PROGRESSIVE, ("small", "medium", "large"), ("large",), gate="escalate"),
        {},
        [chunk(0.01, 0, "Yes", last=True, logprob=UNSURE), end(0.02, 0)]
        + [chunk(0.2, 1, "No", last=True, logprob=SURE), end(0.2, 1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "open#1 medium in 1 s", "read#1", "start r1 replaces r0 keeps 0"]
        + ["r1: 'No'", "ended#1 OK", "end r1 stop", "refinement completed"]
        + ["final r1 medium: refined by medium (draft unsure: 0.90 < 0.945)"],
    ),
    "escalate gate: small and medium unsure, large answers as revision 2": (
        plan(PROGRESSIVE, ("small", "medium", "large"), gate="escalate"),
        {},
        [chunk(0.01, 0, "Yes", last=True, logprob=UNSURE), end(0.02, 0)]
        + [chunk(0.2, 1, "No", last=True, logprob=UNSURE), end(0.2, 1)]
        + [chunk(0.5, 2, "Maybe", last=True, logprob=UNSURE), end(0.5, 2)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "open#1 medium in 1 s", "read#1", "start r1 replaces r0 keeps 0"]
        + ["r1: 'No'", "ended#1 OK", "end r1 stop", "open#2 large in 0.82 s", "read#2"]
        + ["start r2 replaces r1 keeps 0", "r2: 'Maybe'", "ended#2 OK", "end r2 stop"]
        + ["refinement completed"]
        + [
            "final r2 large: refined by medium (draft unsure: 0.90 < 0.945), itself unsure "
            "(0.90 < 0.99); refined by large (draft unsure: 0.90 < 0.99)"
        ],
    ),
    "escalate gate: the last step fails, the answer before it stands": (
        plan(PROGRESSIVE, ("small", "medium", "large"), gate="escalate"),
        {},
        [chunk(0.01, 0, "Yes", last=True, logprob=UNSURE), end(0.02, 0)]
        + [chunk(0.2, 1, "No", last=True, logprob=UNSURE), end(0.2, 1)]
        + [fail(0.5, 2, "UNAVAILABLE")],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "open#1 medium in 1 s", "read#1", "start r1 replaces r0 keeps 0"]
        + ["r1: 'No'", "ended#1 OK", "end r1 stop", "open#2 large in 0.82 s", "read#2"]
        + ["ended#2 UNAVAILABLE", "refinement failed"]
        + [
            "final r1 medium: refined by medium (draft unsure: 0.90 < 0.945), itself unsure "
            "(0.90 < 0.99); refinement by large failed (UNAVAILABLE: boom); draft kept"
        ],
    ),
    "escalate gate: an unsure answer at the top of the chain is the answer": (
        plan(PROGRESSIVE, ("small", "medium"), gate="escalate"),
        {},
        [chunk(0.01, 0, "Yes", last=True, logprob=UNSURE), end(0.02, 0)]
        + [chunk(0.2, 1, "No", last=True, logprob=UNSURE), end(0.2, 1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'Yes'", "ended#0 OK"]
        + ["end r0 stop", "open#1 medium in 1 s", "read#1", "start r1 replaces r0 keeps 0"]
        + ["r1: 'No'", "ended#1 OK", "end r1 stop", "refinement completed"]
        + ["final r1 medium: refined by medium (draft unsure: 0.90 < 0.945)"],
    ),
    "escalate gate: a chain of large alone": (
        plan(PROGRESSIVE, ("large",), gate="escalate"),
        {},
        [chunk(0.01, 0, "No", last=True, logprob=UNSURE), end(0.02, 0)],
        ["open#0 large in 30 s", "route", "read#0", "start r0", "r0: 'No'", "ended#0 OK"]
        + ["end r0 stop", "final r0 large: large only; answered by large"],
    ),
    "first token late: the fallback tier races it and wins": (
        plan(ROUTED, ("large",), ("medium",), first_token_timeout_s=0.2),
        {},
        [timer(0.2), chunk(0.3, 1, "Hi", last=True), end(0.35, 1)],
        ["open#0 large in 30 s", "route", "read#0", "timer", "open#1 medium in 30 s", "read#1"]
        + ["cancel#0", "ended#0 CANCELLED", "start r0", "r0: 'Hi'", "ended#1 OK", "end r0 stop"]
        + ["final r0 medium: no first token from large within 200 ms; answered by medium"],
    ),
    "first token late: a racer that fails loses, the late call answers": (
        plan(ROUTED, ("large",), ("medium",), first_token_timeout_s=0.2),
        {},
        [timer(0.2), fail(0.25, 1, "UNAVAILABLE"), chunk(0.4, 0, "Hi", last=True), end(0.4, 0)],
        ["open#0 large in 30 s", "route", "read#0", "timer", "open#1 medium in 30 s", "read#1"]
        + ["ended#1 UNAVAILABLE", "start r0", "r0: 'Hi'", "ended#0 OK", "end r0 stop"]
        + ["final r0 large: answered by large"],
    ),
    "first token in time: the timer is stopped": (
        plan(ROUTED, ("large",), ("medium",), first_token_timeout_s=0.2),
        {},
        [chunk(0.1, 0, "Hi", last=True), end(0.1, 0)],
        ["open#0 large in 30 s", "route", "read#0", "timer", "stop timer", "start r0"]
        + ["r0: 'Hi'", "ended#0 OK", "end r0 stop", "final r0 large: answered by large"],
    ),
    "the client leaves mid-draft: both calls are cancelled": (
        plan(PROGRESSIVE, ("small", "large")),
        {},
        [chunk(0.01, 0, "The"), left(0.1)],
        ["open#0 small in 30 s", "route", "read#0", "start r0", "r0: 'The'"]
        + ["open#1 large in 1 s", "cancel#0", "cancel#1"],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name: str) -> None:
    chat, replicas, inputs, expected = SCENARIOS[name]
    driven = run(chat, inputs, replicas)
    assert driven.lines == expected
    if any(line.startswith("final") for line in driven.lines):
        assert driven.core.done


def test_tier_calls_carry_what_is_left_of_the_clients_deadline() -> None:
    driven = run(
        plan(ROUTED, ("small",), ("medium",)), [fail(0.5, 0, "UNAVAILABLE")], deadline_s=2.0
    )
    assert [line for line in driven.lines if line.startswith("open")] == [
        "open#0 small in 2 s",
        "open#1 medium in 1.5 s",
    ]


def test_the_refine_budget_stops_short_of_the_clients_deadline() -> None:
    driven = run(plan(PROGRESSIVE, ("small", "large")), [chunk(0.1, 0, "The")], deadline_s=0.5)
    # the budget (1 s) is cut to what is left (0.4 s) less the margin kept to send Final
    assert [a.timeout_s for a in driven.opens] == [0.5, pytest.approx(0.35)]


def test_a_continued_answer_is_whole_in_final_and_its_usage() -> None:
    chat = plan(ROUTED, ("small",), ("medium",))
    inputs = [chunk(0.01, 0, "The"), chunk(0.02, 0, " price"), fail(0.03, 0, "UNAVAILABLE")]
    inputs += [chunk(0.1, 1, " is $5", last=True), end(0.1, 1)]
    driven = run(chat, inputs, {"small": 2})
    continuation = driven.opens[1].continuation
    assert continuation is not None
    assert (continuation.token_ids, continuation.text_chars) == ((0, 1), 9)
    final = driven.core.calls[1]
    assert final.text == "The price is $5" and final.token_ids == [0, 1, 0]
    assert final.usage is not None
    # the tier counted the 2 carried tokens as prompt: they are the answer's
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (1, 3)


def test_input_from_a_call_no_longer_read_changes_nothing() -> None:
    chat = plan(ROUTED, ("large",), ("medium",), first_token_timeout_s=0.2)
    driven = run(chat, [timer(0.2), chunk(0.3, 1, "Hi")])
    before = list(driven.lines)
    driven.feed(0.4, "chunk", 0, ("late", False, -0.1))  # the cancelled loser
    driven.feed(0.4, "fail", 0, ("UNAVAILABLE", None))
    assert driven.lines == before
