"""What the chat session's core knows of each tier call it opened (CallState: the text, tokens
and usage it streamed, how it ended), a tier's failure as plain data (TierError), which failures
another tier may answer, and the events built from calls: TierCallEnded and Final.

Plain data and pure functions: no gRPC, no asyncio, no clock of its own (times come in as
arguments). The driver turns a gRPC failure into a TierError (chat_outcomes.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tiermesh.v1 import common_pb2, router_pb2, tier_pb2

from services.router.chat_events import TierCallEnded
from services.router.chat_plan import SessionClock

# Failures another tier may answer instead: the tier is down, broken, stalled or full. The rest
# (bad input, the client's deadline, a cancel) would fail the same way anywhere.
FAILOVER_CODES = frozenset(
    {"UNAVAILABLE", "UNKNOWN", "INTERNAL", "DATA_LOSS", "RESOURCE_EXHAUSTED", "ABORTED"}
)


@dataclass(frozen=True)
class TierError:
    """A tier call's failure: its gRPC status name and details, the google.rpc details it sent
    (relayed as they are when the failure reaches the client), and its ErrorInfo reason."""

    code: str  # a gRPC status name: "UNAVAILABLE", "DEADLINE_EXCEEDED", ...
    details: str = ""
    status_details: tuple[tuple[str, str | bytes], ...] = ()  # grpc-status-details-bin
    reason: str = ""  # its ErrorInfo reason, when given ("OVERLOADED", "PROMPT_TOO_LONG", ...)
    metadata: Mapping[str, str] = field(default_factory=dict)  # its ErrorInfo metadata


def describe(error: TierError) -> str:
    """A failure as "CODE: details", for reasons and RevisionEnd.error."""
    return f"{error.code}: {error.details}"


@dataclass(frozen=True)
class Continuation:
    """What a call that continues a broken answer sends: the tokens already streamed (which it
    prefills after the prompt), their text's length, their log-probabilities, and the model
    that produced them (a replica of another model refuses)."""

    token_ids: tuple[int, ...]
    text_chars: int
    logprobs: tuple[float, ...]
    model: str
    model_fingerprint: str


@dataclass
class CallState:
    """One tier call as the core sees it: everything its chunks carried so far."""

    id: int
    tier: str
    request_id: str
    timeout_s: float | None
    priority: str = "interactive"  # the chat's: interactive, batch or critical
    endpoint: str = ""  # the replica it went to, once the driver opened it
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    carried_tokens: int = 0  # tokens of a broken call this one continues
    usage: common_pb2.Usage | None = None
    finish_reason: str = ""
    stop_sequence: str = ""  # the stop sequence that ended it, when one did
    model: str = ""  # the answering model, "<tier>/<model>", from the tier's chunks
    model_fingerprint: str = ""
    error: TierError | None = None
    revision: int | None = None  # the revision it produced, once shown
    cancelled: bool = False  # cancelled by the router while it ran
    over: bool = False  # finished, failed or cancelled: no more input expected
    reported: bool = False  # its TierCallEnded was emitted

    def continue_from(self, broken: CallState) -> Continuation:
        """This call continues `broken`'s answer: its text, tokens and usage then cover the
        whole answer, as if it had not broken. Returns what its request must carry."""
        self.text, self.token_ids = broken.text, list(broken.token_ids)
        self.logprobs = list(broken.logprobs)
        self.carried_tokens = len(broken.token_ids)
        # whose tokens they are, until this call's own chunks say (a continuation that breaks
        # before its first chunk passes them on)
        self.model, self.model_fingerprint = broken.model, broken.model_fingerprint
        return Continuation(
            tuple(broken.token_ids),
            len(broken.text),
            tuple(broken.logprobs),
            broken.model,
            broken.model_fingerprint,
        )

    def add(self, chunk: tier_pb2.GenerateChunk) -> None:
        """Takes in one chunk of the tier's stream."""
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.model:  # on the first chunk with a token and on the last
            self.model = chunk.model
            self.model_fingerprint = chunk.model_fingerprint
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
            self.stop_sequence = chunk.stop_sequence
            self.usage = self._answer_usage(chunk.usage)

    def _answer_usage(self, usage: common_pb2.Usage) -> common_pb2.Usage:
        """The tier's usage, with a continued answer's carried tokens counted as completion
        tokens (the tier counts them as prompt)."""
        if not self.carried_tokens:
            return usage
        whole = common_pb2.Usage()
        whole.CopyFrom(usage)
        whole.prompt_tokens = max(0, usage.prompt_tokens - self.carried_tokens)
        whole.completion_tokens = usage.completion_tokens + self.carried_tokens
        return whole

    @property
    def confidence(self) -> float:
        """Geometric-mean probability of the tokens so far, in [0, 1] (0 when none)."""
        if not self.logprobs:
            return 0.0
        return math.exp(sum(self.logprobs) / len(self.logprobs))


def ended_event(call: CallState) -> TierCallEnded:
    """How the call ended for the router: its failure, its finish, or else cancelled."""
    code, message, reason = "CANCELLED", "cancelled by the router", ""
    if call.error is not None:
        code, message, reason = call.error.code, call.error.details, call.error.reason
    elif call.finish_reason:
        code, message = "OK", ""
    return TierCallEnded(
        call.tier,
        call.request_id,
        code,
        message,
        call.usage,
        call.endpoint,
        call.model,
        reason,
        call.priority,
    )


def final_event(
    calls: list[CallState],
    call: CallState,
    revision: int,
    reason: str,
    clock: SessionClock,
    now: float,
) -> router_pb2.ChatEvent:
    """Final naming `call`'s revision as the answer, with every call's usage and the timings
    (`now` on the clock's perf_counter scale)."""
    usage = []
    for c in calls:
        tier_usage = router_pb2.TierUsage(
            tier=c.tier, usage=c.usage or common_pb2.Usage(), cancelled=c.cancelled
        )
        if c.revision is not None:
            tier_usage.revision = c.revision
        usage.append(tier_usage)
    timings = router_pb2.Timings(
        route_ms=clock.route_ms,
        ttft_ms=clock.ttft_ms,
        time_to_first_draft_ms=clock.first_draft_ms,
        time_to_final_ms=(now - clock.start) * 1000,
    )
    final = router_pb2.Final(
        revision=revision,
        tier=call.tier,
        text=call.text,
        reason=reason,
        usage=usage,
        timings=timings,
        revisions=max((c.revision or 0) for c in calls if c.revision is not None) + 1,
        model=call.model,
    )
    return router_pb2.ChatEvent(final=final)


def refine_failure(call: CallState, error: TierError) -> str:
    """Final.reason when a refinement failed or ran out of its budget and the draft is kept."""
    if error.code == "DEADLINE_EXCEEDED" and call.timeout_s is not None:
        budget = f"{call.timeout_s * 1000:.0f} ms"
        return f"refinement by {call.tier} exceeded its {budget} budget; draft kept"
    return f"refinement by {call.tier} failed ({describe(error)}); draft kept"
