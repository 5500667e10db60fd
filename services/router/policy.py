"""Routing policies: given a request and the tiers' live load, choose a tier and say why.

A policy is a small object with a name and `route()`; the router calls it once per ROUTED
request, on its event loop, so `route()` must be fast (well under a millisecond) and must not
block. Policies know nothing of gRPC.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from services.common.errors import ConfigError


@dataclass(frozen=True)
class RoutingInput:
    """What a policy may look at: the conversation and the generation budget."""

    turns: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int

    @property
    def user_text(self) -> str:
        return "\n".join(content for role, content in self.turns if role == "user")


@dataclass(frozen=True)
class TierLoad:
    """The load of one tier as the router last saw it."""

    running: int
    queued: int
    max_running: int
    max_queued: int
    ttft_ms_p50: float
    ttft_ms_p99: float


@dataclass(frozen=True)
class RouteChoice:
    tier: str
    complexity: float  # predicted complexity in [0, 1]
    policy: str
    reason: str


class RoutingPolicy(Protocol):
    """Chooses the tier for one request. `loads` maps tier name to its last known load (None
    when unknown); a policy may ignore it. Must not raise for any well-formed request."""

    name: str

    def route(self, request: RoutingInput, loads: Mapping[str, TierLoad | None]) -> RouteChoice: ...


_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_STEP_WORDS = re.compile(
    r"\b(total|discount|shipping|tax|plus|each|per|percent|sum|calculate|altogether|coupon)\b|%",
    re.IGNORECASE,
)


def heuristic_complexity(text: str) -> float:
    """An interim complexity score in [0, 1] from surface signals of multi-step requests.

    Numbers (quantities, prices) and words that chain steps (total, discount, shipping, ...)
    push the score up, as does length. A stand-in until a predictor trained on measured labels
    replaces it.
    """
    numbers = len(_NUMBER.findall(text))
    steps = len(_STEP_WORDS.findall(text))
    words = len(text.split())
    score = 0.12 * min(numbers, 5) + 0.1 * min(steps, 4) + min(words / 100, 0.3)
    return max(0.0, min(1.0, score))


class InterimHeuristicPolicy:
    """Thresholds on heuristic_complexity: < 0.3 small, < 0.7 medium, else large.

    Interim: it reads no load and learns nothing; trained policies replace it.
    """

    name = "interim_heuristic"

    def __init__(self, small_below: float = 0.3, medium_below: float = 0.7) -> None:
        self._small_below = small_below
        self._medium_below = medium_below

    def route(self, request: RoutingInput, loads: Mapping[str, TierLoad | None]) -> RouteChoice:
        score = heuristic_complexity(request.user_text)
        if score < self._small_below:
            tier, band = "small", f"< {self._small_below}"
        elif score < self._medium_below:
            tier, band = "medium", f"< {self._medium_below}"
        else:
            tier, band = "large", f">= {self._medium_below}"
        available = [name for name, load in loads.items()]
        if available and tier not in available:
            tier = available[-1]
        return RouteChoice(tier, score, self.name, f"heuristic complexity {score:.2f} {band}")


def create_policy(name: str) -> RoutingPolicy:
    if name == InterimHeuristicPolicy.name:
        return InterimHeuristicPolicy()
    raise ConfigError(f"policy: unknown routing policy {name!r} (known: interim_heuristic)")
