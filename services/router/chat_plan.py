"""What the router decided to run for one chat (ChatPlan), the clock its Final timings read,
and the ids of its tier calls.

Plain data: knows the protobuf messages and the policy's RouteChoice; makes no calls.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from tiermesh.v1 import router_pb2, tier_pb2

from services.common.validation import MAX_REQUEST_ID_CHARS
from services.router.escalation import Escalation
from services.router.policy import RouteChoice


@dataclass(frozen=True)
class ChatPlan:
    """What the router decided to run for one chat."""

    request_id: str
    mode: int  # router_pb2.Mode
    tiers: tuple[str, ...]  # in revision order: one tier, (draft, refine), or escalate's chain
    generate: tier_pb2.GenerateRequest  # the tier request, without request_id
    decision: router_pb2.RouteDecision
    fallback_tier: str | None = None  # ROUTED/PINNED: started if the first token is late
    first_token_timeout_s: float = 0.0  # 0 = no timeout fallback
    # Where a failed call moves on, in order (each tier at most once per chat): ROUTED/PINNED
    # continue their answer there; PROGRESSIVE uses them for a failed refinement.
    fallbacks: tuple[str, ...] = ()
    retry_first_token: bool = False  # a call failing before its first token moves on unseen
    gate: str = "always"  # PROGRESSIVE: "always", "race", "cascade" or "escalate"
    min_confidence: float = 0.0  # PROGRESSIVE: a draft at least this confident is kept
    escalation: Escalation | None = None  # gate "escalate": its thresholds
    choice: RouteChoice | None = None  # the policy's view of the request (for learning)
    note: str = ""  # what overload did to the route ("stepped down from large: ..."), or ""
    priority: str = "interactive"  # interactive, batch or critical


@dataclass
class SessionClock:
    """Milliseconds since the router received the request, and the marks Final reports."""

    start: float = field(default_factory=time.perf_counter)
    route_ms: float = 0.0
    ttft_ms: float = 0.0
    first_draft_ms: float = 0.0

    def ms(self) -> float:
        return (time.perf_counter() - self.start) * 1000


def tier_request_id(chat_id: str, tier: str) -> str:
    """The id of one tier call, owned by the router: unique per call (two chats with the same
    client id never share one, so cancelling one cannot abort the other), the client's id kept
    as its label, cut so the whole fits the tiers' limit."""
    suffix = f"/{tier}/{secrets.token_hex(6)}"
    return chat_id[: MAX_REQUEST_ID_CHARS - len(suffix)] + suffix
