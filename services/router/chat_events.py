"""What one chat session reports, and the interface of those who watch it.

A session yields SessionEvents: the router_pb2.ChatEvent messages the client sees, in wire order,
and between them the observations only the router's own observers need (a tier call opening or
ending, what became of a refinement). Observers (telemetry, the learning signal) are handed each
event by whoever relays the stream. Knows the protobuf messages; knows nothing of gRPC calls,
OpenTelemetry or routing policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from tiermesh.v1 import common_pb2, router_pb2

REFINEMENT_OUTCOMES = ("completed", "failed", "timeout", "skipped", "cancelled")


@dataclass
class TierCallOpening:
    """A tier call is about to start. An observer may append to `metadata` (trace context, say):
    the session opens the call with it when the relay asks for the next event."""

    tier: str
    request_id: str  # the tier request's id, unique per call: "<chat request id>/<tier>/<hex>"
    metadata: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class TierCallEnded:
    """A tier call is over for the router: finished, failed, or cancelled by the router. Calls
    still running when the session stops early (client gone, error) are never reported: an
    observer treats whatever it still has open then as cancelled."""

    tier: str
    request_id: str
    code: str  # a gRPC status name: OK, CANCELLED (the router cancelled it), or the tier's
    message: str = ""
    usage: common_pb2.Usage | None = None  # the tier's usage, when it finished
    endpoint: str = ""  # the replica of the tier the call went to (its address)
    model: str = ""  # the model that answered, "<tier>/<model>", when the tier finished
    reason: str = ""  # the ErrorInfo reason of the tier's failure, when it gave one
    priority: str = "interactive"  # the chat's (a refused batch call says nothing for others)


@dataclass(frozen=True)
class RefinementSettled:
    """PROGRESSIVE only, just before Final: what became of the refinement."""

    outcome: str  # one of REFINEMENT_OUTCOMES


SessionEvent: TypeAlias = router_pb2.ChatEvent | TierCallOpening | TierCallEnded | RefinementSettled


class ChatObserver(Protocol):
    """Watches one chat's events. Called from the event loop, in stream order, before the relay
    asks the session for the next event; must not block or raise."""

    def observe(self, event: SessionEvent) -> None: ...
