"""Whether a tier, and which of its replicas, may take a new call now: what each replica reports
itself (its load and health streams, tier_loads.py) and what its calls show (passive ejection,
outlier.py), with the reason when none may. Picks the replica a call goes to (the least loaded
able one, in turn among equals), and as a chat observer feeds each call's outcome to the
ejection bookkeeping.

Knows the chat events, tier and replica names; knows nothing of gRPC channels or policies.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from services.common.errors import WAIT_PAST_DEADLINE
from services.router.chat_events import SessionEvent, TierCallEnded
from services.router.outlier import OutlierDetector
from services.router.overload import BATCH
from services.router.policy import TierLoad

log = logging.getLogger(__name__)


class ReplicaReports(Protocol):
    """What the replicas say of themselves (tier_loads.TierLoadWatcher)."""

    def endpoint_down(self, endpoint: str) -> str | None: ...

    def endpoint_load(self, endpoint: str) -> TierLoad | None: ...

    def note_refusal(self, endpoint: str, batch_only: bool = False) -> None:
        """A call to the replica was refused for overload (RESOURCE_EXHAUSTED); `batch_only`:
        the call was a batch chat's."""

    def endpoint_loading(self, endpoint: str) -> bool:
        """Whether the replica is up but still loading its model (will serve soon)."""
        ...

    async def changed(self, timeout_s: float) -> None:
        """Returns when a replica starts or stops serving, or after `timeout_s`."""


class NoReports:
    """Every replica up, load unknown: for a router that watches nothing (tests)."""

    def endpoint_down(self, endpoint: str) -> str | None:
        return None

    def endpoint_load(self, endpoint: str) -> TierLoad | None:
        return None

    def note_refusal(self, endpoint: str, batch_only: bool = False) -> None:
        return None

    def endpoint_loading(self, endpoint: str) -> bool:
        return False

    async def changed(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)


class TierHealth:
    """One per router. Not thread-safe: one event loop."""

    def __init__(
        self,
        replicas: Mapping[str, Sequence[str]] | None = None,
        reports: ReplicaReports | None = None,
        outliers: OutlierDetector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`replicas`: tier -> its replicas' addresses (none: nothing is ever down)."""
        self._replicas = {tier: tuple(endpoints) for tier, endpoints in (replicas or {}).items()}
        self._reports = reports if reports is not None else NoReports()
        self._outliers = outliers
        self._clock = clock
        self._turn = itertools.count()

    def endpoint_down(self, endpoint: str) -> str | None:
        """Why the replica must not take a new call now, or None if it may."""
        why = self._reports.endpoint_down(endpoint)
        if why is None and self._outliers is not None:
            why = self._outliers.blocked(endpoint, self._clock())
        return why

    def down(self, tier: str) -> str | None:
        """Why `tier` must not take a new call now (no replica may), or None if it may."""
        endpoints = self._replicas.get(tier, ())
        reasons = []
        for endpoint in endpoints:
            why = self.endpoint_down(endpoint)
            if why is None:
                return None
            reasons.append(f"{endpoint}: {why}")
        if not reasons:
            return None
        if len(endpoints) == 1:
            return f"{tier} {reasons[0].partition(': ')[2]}"
        return f"{tier} has no replica able to serve ({'; '.join(reasons)})"

    def loading(self, tier: str) -> bool:
        """Whether a replica of `tier` is still loading its model (it will serve soon)."""
        return any(self._reports.endpoint_loading(e) for e in self._replicas.get(tier, ()))

    async def changed(self, timeout_s: float) -> None:
        """Returns when a replica starts or stops serving, or after `timeout_s`."""
        await self._reports.changed(timeout_s)

    def has_room(self, tier: str, avoid: Collection[str]) -> bool:
        """Whether a replica of `tier`, none of `avoid`, may take a call and by its last load
        report would start it at once (a running slot free, nobody queued, no refusal for
        overload since): where a call another tier refused for overload may go on without
        queueing again. Unknown load is no room."""
        for endpoint in self._replicas.get(tier, ()):
            if endpoint in avoid or self.endpoint_down(endpoint) is not None:
                continue
            load = self._reports.endpoint_load(endpoint)
            if load is None or not load.serving or load.refusing:
                continue
            if load.running + load.queued < load.max_running:
                return True
        return False

    def queueing(self, endpoint: str) -> bool:
        """Whether the replica is up by its own reports (fresh, serving) and its last load
        report has requests waiting: a call to it that has sent nothing yet may be waiting there
        for a running slot, not hung."""
        if self._reports.endpoint_down(endpoint) is not None:
            return False
        load = self._reports.endpoint_load(endpoint)
        return load is not None and load.serving and load.queued > 0

    def pick(self, tier: str, candidates: Sequence[str]) -> str:
        """The replica among `candidates` a new call goes to: able ones before the rest, the
        least loaded first, in turn among equals. A replica past its ejection takes it as its
        probe."""
        turn = next(self._turn)

        def rank(indexed: tuple[int, str]) -> tuple[bool, float, int]:
            index, endpoint = indexed
            load = self._reports.endpoint_load(endpoint)
            fill = load.fill if load is not None else 0.0
            return (
                self.endpoint_down(endpoint) is not None,
                fill,
                (index - turn) % len(candidates),
            )

        endpoint = min(enumerate(candidates), key=rank)[1]
        if self._outliers is not None:
            self._outliers.starting(endpoint, self._clock())
        return endpoint

    def observe(self, event: SessionEvent) -> None:
        """A ChatObserver: counts each tier call's outcome for or against its replica, and
        tells the replica's reports of a refusal for overload."""
        if not isinstance(event, TierCallEnded):
            return
        endpoint = event.endpoint or event.tier
        # a refusal only for the caller's short deadline says nothing of room for others
        if event.code == "RESOURCE_EXHAUSTED" and event.reason != WAIT_PAST_DEADLINE:
            self._reports.note_refusal(endpoint, batch_only=event.priority == BATCH)
        if self._outliers is None:
            return
        now = self._clock()
        was = self._outliers.blocked(endpoint, now)
        self._outliers.ended(endpoint, event.code, now)
        if was is None and (why := self._outliers.blocked(endpoint, now)) is not None:
            log.warning(
                "tier %s at %s %s (last: %s %s)",
                event.tier,
                endpoint,
                why,
                event.code,
                event.message,
            )
