"""What each chat streamed, kept per request id while the bench's load generator drives it: per
revision its text, token ids, first and last delta times and how it ended, and the Final event.

`RecordingClient` is the SDK's AsyncRouterClient with its event stream observed on the way to the
caller (services.bench.loadgen reads the same events as it always does), so the chaos checks
see every delta without a second load generator. Knows the SDK's events only.
"""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from tiermesh.client import AsyncRouterClient, DeltaEvent, FinalEvent
from tiermesh.client.events import Event, RevisionEndEvent, RevisionStartEvent, RouteEvent


@dataclass
class RevisionTrace:
    tier: str = ""
    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    first_delta_s: float | None = None  # perf_counter of its first and last deltas
    last_delta_s: float | None = None
    delta_s: list[float] = field(default_factory=list)  # perf_counter of every delta
    ended_s: float | None = None  # perf_counter of its RevisionEnd
    finish_reason: str = ""
    error: str = ""

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


@dataclass
class StreamTrace:
    """One chat as streamed: its revisions in order and its Final (None if it failed)."""

    options: dict[str, Any]
    revisions: dict[int, RevisionTrace] = field(default_factory=dict)
    final: FinalEvent | None = None
    route: RouteEvent | None = None

    @property
    def step_down(self) -> str | None:
        """ "from->to" when overload moved the chat off the tier its policy chose, else None."""
        route = self.route
        if route is None or not route.stepped_from or not route.tiers:
            return None
        return f"{route.stepped_from}->{route.tiers[0]}"

    def observe(self, event: Event, now: float) -> None:
        if isinstance(event, RouteEvent):
            self.route = event
        elif isinstance(event, RevisionStartEvent):
            self.revisions[event.revision] = RevisionTrace(tier=event.tier)
        elif isinstance(event, DeltaEvent):
            revision = self.revisions.setdefault(event.revision, RevisionTrace())
            revision.text_parts.append(event.text)
            revision.token_ids.extend(event.token_ids)
            if revision.first_delta_s is None:
                revision.first_delta_s = now
            revision.last_delta_s = now
            revision.delta_s.append(now)
        elif isinstance(event, RevisionEndEvent):
            revision = self.revisions.setdefault(event.revision, RevisionTrace())
            revision.finish_reason, revision.error = event.finish_reason, event.error
            revision.ended_s = now
        elif isinstance(event, FinalEvent):
            self.final = event

    def failover_gaps_s(self) -> list[tuple[float, float | None]]:
        """For each revision that broke (finish reason `error`) after streaming: the time from
        its last delta to the first delta of the revision that replaced it, and the part of it
        until the client was told the revision broke (its RevisionEnd)."""
        return [(f.gap_s, f.told_s) for f in self.failovers()]

    def failovers(self) -> list[Failover]:
        """Each revision that broke after streaming and the one that replaced it (see
        failover_gaps_s), with how many tokens the broken one had streamed."""
        found: list[Failover] = []
        ordered = [self.revisions[n] for n in sorted(self.revisions)]
        for broken, after in itertools.pairwise(ordered):
            if broken.finish_reason != "error" or broken.last_delta_s is None:
                continue
            if after.first_delta_s is not None:
                told = None if broken.ended_s is None else broken.ended_s - broken.last_delta_s
                gap = after.first_delta_s - broken.last_delta_s
                found.append(Failover(gap, told, len(broken.token_ids)))
        return found

    def continuation_gaps_s(self) -> list[float]:
        """For each break continued in the same revision by another replica (Final.reason says
        `continued revision N`, once per break): the longest pause between that revision's
        deltas, one per break (the client sees no event at the break itself, so the pause
        around it is taken to be the longest; when it is not, this overstates the gap)."""
        if self.final is None:
            return []
        gaps: list[float] = []
        breaks = Counter(int(n) for n in CONTINUED.findall(self.final.reason))
        for number, count in breaks.items():
            revision = self.revisions.get(number)
            if revision is None:
                continue
            pauses = sorted((b - a for a, b in itertools.pairwise(revision.delta_s)), reverse=True)
            gaps.extend(pauses[:count])
        return gaps


CONTINUED = re.compile(r"continued revision (\d+)")


@dataclass(frozen=True)
class Failover:
    """A broken revision replaced: the gap between the last delta before and the first after,
    the part until the break was told, and the tokens the broken revision had streamed (which a
    replacing revision that starts over streams again before anything new: its first delta comes
    once its text has passed them, or differs)."""

    gap_s: float
    told_s: float | None
    broken_tokens: int


class RecordingClient(AsyncRouterClient):
    """An AsyncRouterClient that keeps a StreamTrace per request id (ids must be unique)."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        super().__init__(address, **kwargs)
        self.traces: dict[str, StreamTrace] = {}

    async def chat_stream(
        self, prompt: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> AsyncIterator[Event]:
        trace = StreamTrace({"prompt": prompt, **options})
        self.traces[str(options.get("request_id", ""))] = trace
        async for event in super().chat_stream(prompt, timeout=timeout, **options):
            trace.observe(event, time.perf_counter())
            yield event

    async def __aenter__(self) -> RecordingClient:
        return self
