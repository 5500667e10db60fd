"""How a chat's tier calls turned out: which failures another tier may answer, the failure
relayed when no answer is left, the outcome of one revision and of a stream with failover, how
a call ended for the observers, and the Final that names the answer (with the reason when a
refinement is dropped).

Knows the tier calls and the wire messages; makes no calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import common_pb2, router_pb2

from services.router.chat_events import TierCallEnded
from services.router.chat_plan import SessionClock
from services.router.tier_calls import TierCall

# Failures another tier may answer instead: the tier is down, broken, stalled or full. The rest
# (bad input, the client's deadline, a cancel) would fail the same way anywhere.
FAILOVER_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


class UpstreamFailed(Exception):
    """A tier failed and no other answer is left; relayed to the client with the tier's code."""

    def __init__(self, tier: str, error: grpc.aio.AioRpcError) -> None:
        super().__init__(f"tier {tier}: {error.details()}")
        self.code: grpc.StatusCode = error.code()
        self.details = f"tier {tier}: {error.details()}"
        # the tier's google.rpc details (its RetryInfo, BadRequest, ...), relayed as they are
        self.trailing_metadata = tuple(
            (key, value)
            for key, value in (error.trailing_metadata() or ())
            if key == "grpc-status-details-bin"
        )


@dataclass
class RevisionOutcome:
    started: bool = False  # RevisionStart was sent
    complete: bool = False  # the tier finished normally
    error: grpc.aio.AioRpcError | None = None


@dataclass
class Answer:
    """Where a stream with failover ended: its last call and revision, complete or failed."""

    call: TierCall
    revision: int
    complete: bool = False
    error: grpc.aio.AioRpcError | None = None
    notes: list[str] = field(default_factory=list)  # what the failover did, for Final.reason


def final_event(
    calls: list[TierCall], call: TierCall, revision: int, reason: str, clock: SessionClock
) -> router_pb2.ChatEvent:
    """Final naming `call`'s revision as the answer, with every call's usage and the timings."""
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
        time_to_final_ms=clock.ms(),
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


def ended_event(call: TierCall) -> TierCallEnded:
    """How the call ended for the router: its failure, its finish, or else cancelled."""
    code, message, reason = "CANCELLED", "cancelled by the router", ""
    if call.error is not None:
        code, message = call.error.code().name, call.error.details() or ""
        if code == "RESOURCE_EXHAUSTED":
            reason = parse_status_details(call.error.trailing_metadata()).reason
    elif call.finished:
        code, message = "OK", ""
    return TierCallEnded(
        call.tier, call.request_id, code, message, call.usage, call.endpoint, call.model, reason
    )


def refine_failure(call: TierCall, error: grpc.aio.AioRpcError) -> str:
    """Final.reason when a refinement failed or ran out of its budget and the draft is kept."""
    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and call.timeout_s is not None:
        budget = f"{call.timeout_s * 1000:.0f} ms"
        return f"refinement by {call.tier} exceeded its {budget} budget; draft kept"
    return f"refinement by {call.tier} failed ({describe(error)}); draft kept"


def describe(error: grpc.aio.AioRpcError) -> str:
    """A failure as "CODE: details", for reasons and RevisionEnd.error."""
    return f"{error.code().name}: {error.details()}"
