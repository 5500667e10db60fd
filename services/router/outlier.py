"""Passive ejection of failing tier replicas, in the manner of Envoy's outlier detection: after
N consecutive failed calls a replica is ejected for base x 2^k (k = how often it was ejected before,
capped at max); when that time is up, one probe call is let through, and its outcome either
restores the replica (k back to 0) or ejects it again for longer.

Pure bookkeeping over replica names (their addresses) and a clock passed in; knows nothing of
gRPC or routing.
"""

from __future__ import annotations

from dataclasses import dataclass

# Status names of tier calls that count against a tier. The rest (CANCELLED, INVALID_ARGUMENT,
# RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ...) say nothing of its health: the client left, the
# request was bad, the tier said it is full (its load report covers that), or time ran out.
FAILURE_CODES = frozenset({"UNAVAILABLE", "UNKNOWN", "INTERNAL", "DATA_LOSS"})


@dataclass
class _TierRecord:
    consecutive_failures: int = 0
    ejections: int = 0  # ejections in a row without a successful call between them
    ejected_until: float | None = None  # set while ejected or waiting for its probe
    probe_since: float | None = None  # a probe call is out since then


class OutlierDetector:
    """Consecutive-failure ejection per tier. Not thread-safe: one event loop."""

    def __init__(self, failures: int, base_s: float, max_s: float, probe_timeout_s: float) -> None:
        """`failures` in a row eject a tier; `probe_timeout_s` frees a probe slot whose call
        never reported back (its chat ended early)."""
        self._failures = failures
        self._base_s = base_s
        self._max_s = max_s
        self._probe_timeout_s = probe_timeout_s
        self._tiers: dict[str, _TierRecord] = {}

    def _record(self, tier: str) -> _TierRecord:
        return self._tiers.setdefault(tier, _TierRecord())

    def blocked(self, tier: str, now: float) -> str | None:
        """Why `tier` must not take a new call now (ejected, or its probe is out); None if it
        may. Asking takes nothing: call `starting` for the call actually made."""
        record = self._tiers.get(tier)
        if record is None or record.ejected_until is None:
            return None
        if now < record.ejected_until:
            left = record.ejected_until - now
            return (
                f"ejected after {self._failures} failed calls in a row ({left * 1000:.0f} ms left)"
            )
        if record.probe_since is not None and now - record.probe_since < self._probe_timeout_s:
            return "ejected, its probe call still running"
        return None

    def starting(self, tier: str, now: float) -> None:
        """A call to `tier` starts now; past an ejection it is the one probe."""
        record = self._tiers.get(tier)
        if record is not None and record.ejected_until is not None and now >= record.ejected_until:
            record.probe_since = now

    def ended(self, tier: str, code: str, now: float) -> None:
        """A call to `tier` ended with gRPC status `code` (its name)."""
        record = self._record(tier)
        if code == "OK":
            self._tiers[tier] = _TierRecord()
            return
        if code not in FAILURE_CODES:
            record.probe_since = None  # inconclusive: the next call probes again
            return
        probing = record.ejected_until is not None and now >= record.ejected_until
        record.consecutive_failures += 1
        record.probe_since = None
        if probing or record.consecutive_failures >= self._failures:
            hold = min(self._max_s, self._base_s * 2**record.ejections)
            record.ejections += 1
            record.ejected_until = now + hold
            record.consecutive_failures = 0
