"""Routing policies: given a request and the tiers' live load, choose a tier and say why.

A policy has a name, `route()` and `learn()`. The router calls `route()` once per ROUTED
request on its event loop, so it must be fast (well under a millisecond) and must not block or
raise for a well-formed request. `learn()` receives a reward for a past decision (from
Feedback RPCs or progressive refinements); policies that do not learn ignore it. Policies know
nothing of gRPC. Implementations: `interim_heuristic` (here), `keyword`, `threshold`,
`cost_target` (static_policies.py) and `adaptive` (adaptive_policy.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Protocol


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
    """The load of one tier as the tier itself last reported it (WatchLoad)."""

    serving: bool
    running: int
    queued: int
    max_running: int
    max_queued: int
    ttft_ms_p50: float
    ttft_ms_p99: float
    kv_pool_used_tokens: int = 0
    kv_pool_capacity_tokens: int = 0
    refusing: bool = False  # it refused a call for overload since this report, at this load
    # its admission's expected wait for a new request, and the longest it queues one for; it
    # refuses at once past that (0: not reported)
    expected_wait_ms: float = 0.0
    max_wait_ms: float = 0.0
    queued_batch: int = 0  # of `queued`, batch requests: the others go before them
    refusing_batch: bool = False  # it refused a batch call since this report (full for batch)

    @property
    def wait_too_long(self) -> bool:
        """By this report the tier would refuse a new request for its expected wait."""
        return 0 < self.max_wait_ms < self.expected_wait_ms

    @property
    def queue_full(self) -> bool:
        """Takes no more requests: both limits reached, its expected wait past the longest it
        queues for, or it refused one at this load."""
        full = self.queued >= self.max_queued and self.running >= self.max_running
        return self.refusing or full or self.wait_too_long

    def seen_by(self, priority: str) -> TierLoad:
        """This load as a chat of `priority` meets it at the tier's queue: a batch chat waits
        behind everyone and reads the tier full after a batch refusal too; an interactive or
        critical chat waits behind no batch request (and takes one's place at a full queue), so
        the batch requests queued do not count for it (the reported expected wait is already an
        interactive request's)."""
        if priority == "batch":
            return replace(self, refusing=True) if self.refusing_batch else self
        if not self.queued_batch:
            return self
        return replace(self, queued=self.queued - self.queued_batch, queued_batch=0)

    def after_calls(self, change: int) -> TierLoad:
        """This load as it stands after `change` more calls (fewer, if negative) than at the
        report: calls take free running slots first, then queue. The expected wait then
        counts one hand-over (the time the report's own wait implies) per request ahead; with
        a slot free at the report that time is unknown, so a wait is predicted only once the
        report itself had one."""
        total = max(0, self.running + self.queued + change)
        running = min(self.max_running, total)
        queued = total - running
        # the report's wait was (queued + 1) hand-overs, or 0 with a slot free (time unknown)
        per_handover = self.expected_wait_ms / (self.queued + 1)
        wait = per_handover * (queued + 1) if running >= self.max_running else 0.0
        return replace(self, running=running, queued=queued, expected_wait_ms=wait)

    @property
    def fill(self) -> float:
        """How busy the tier is: requests running and queued per decoding slot."""
        return (self.running + self.queued) / max(1, self.max_running)


Loads = Mapping[str, TierLoad | None]  # tier name -> last known load (None: unknown)


class LoadsSeenBy(Mapping[str, "TierLoad | None"]):
    """`loads` as a chat of `priority` meets them (TierLoad.seen_by), read when asked."""

    def __init__(self, loads: Loads, priority: str) -> None:
        self._loads = loads
        self._priority = priority

    def __getitem__(self, tier: str) -> TierLoad | None:
        load = self._loads[tier]
        return None if load is None else load.seen_by(self._priority)

    def __iter__(self) -> Iterator[str]:
        return iter(self._loads)

    def __len__(self) -> int:
        return len(self._loads)


@dataclass(frozen=True)
class RouteChoice:
    tier: str
    complexity: float  # predicted complexity in [0, 1]
    policy: str
    reason: str
    context: tuple[float, ...] = ()  # what a learning policy needs to learn from this choice


class RoutingPolicy(Protocol):
    name: str

    def route(self, request: RoutingInput, loads: Loads) -> RouteChoice: ...

    def learn(self, choice: RouteChoice, tier: str, quality: float) -> None:
        """Rewards `tier` for the request behind `choice` with a quality in [0, 1]."""


_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_STEP_WORDS = re.compile(
    r"\b(total|discount|shipping|tax|plus|each|per|percent|sum|calculate|altogether|coupon)\b|%",
    re.IGNORECASE,
)


def heuristic_complexity(text: str) -> float:
    """An interim complexity score in [0, 1] from surface signals of multi-step requests.

    Numbers (quantities, prices) and words that chain steps (total, discount, shipping, ...)
    push the score up, as does length. Needs no trained artifact.
    """
    numbers = len(_NUMBER.findall(text))
    steps = len(_STEP_WORDS.findall(text))
    words = len(text.split())
    score = 0.12 * min(numbers, 5) + 0.1 * min(steps, 4) + min(words / 100, 0.3)
    return max(0.0, min(1.0, score))


def band(score: float, small_below: float, medium_below: float) -> tuple[str, str]:
    """The tier a score falls in, and the band as text (e.g. "< 0.3")."""
    if score < small_below:
        return "small", f"< {small_below:.2f}"
    if score < medium_below:
        return "medium", f"< {medium_below:.2f}"
    return "large", f">= {medium_below:.2f}"


class InterimHeuristicPolicy:
    """Thresholds on heuristic_complexity: < 0.3 small, < 0.7 medium, else large. Reads no
    load and learns nothing; the trained policies replace it."""

    name = "interim_heuristic"

    def __init__(self, small_below: float = 0.3, medium_below: float = 0.7) -> None:
        self._small_below = small_below
        self._medium_below = medium_below

    @property
    def thresholds(self) -> tuple[float, float]:
        """(small_below, medium_below) on the heuristic score."""
        return self._small_below, self._medium_below

    def route(self, request: RoutingInput, loads: Loads) -> RouteChoice:
        score = heuristic_complexity(request.user_text)
        tier, where = band(score, self._small_below, self._medium_below)
        return RouteChoice(tier, score, self.name, f"heuristic complexity {score:.2f} {where}")

    def learn(self, choice: RouteChoice, tier: str, quality: float) -> None:
        return None
