"""Whether a tier may take a new call now: what the tier itself reports (its load and health
streams, tier_loads.py) and what its calls show (passive ejection, outlier.py), in one answer
with the reason. Its observer feeds each chat's tier-call outcomes to the ejection bookkeeping.

Knows the chat events and tier names; knows nothing of gRPC channels or policies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from services.router.chat_events import SessionEvent, TierCallEnded, TierCallOpening
from services.router.fallback import Down, never_down
from services.router.outlier import OutlierDetector

log = logging.getLogger(__name__)


class TierHealth:
    """One per router. Not thread-safe: one event loop."""

    def __init__(
        self,
        reports: Down = never_down,
        outliers: OutlierDetector | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reports = reports
        self._outliers = outliers
        self._clock = clock

    def down(self, tier: str) -> str | None:
        """Why `tier` must not take a new call now, or None if it may."""
        why = self._reports(tier)
        if why is None and self._outliers is not None:
            why = self._outliers.blocked(tier, self._clock())
        return why

    def observe(self, event: SessionEvent) -> None:
        """A ChatObserver: counts each tier call's outcome for or against its tier."""
        if self._outliers is None:
            return
        if isinstance(event, TierCallOpening):
            self._outliers.starting(event.tier, self._clock())
        elif isinstance(event, TierCallEnded):
            now = self._clock()
            was = self._outliers.blocked(event.tier, now)
            self._outliers.ended(event.tier, event.code, now)
            if was is None and (why := self._outliers.blocked(event.tier, now)) is not None:
                log.warning("%s (last: %s %s)", why, event.code, event.message)
