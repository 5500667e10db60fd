"""Health- and load-aware fallback: when the chosen tier is down (its reports say so, or it was
ejected for failing), would break its TTFT SLO, has no room, or its load is unknown, the request
goes to the next tier in the configured fallback order. Unknown load never counts as room.
When every tier of the chain reports itself full (both its limits reached, or its expected
wait for a slot past the longest it queues a request for), or refused a call at the load it
last reported (TierLoad.refusing), the request is refused at once (TiersFull).

Pure decision logic over TierLoad snapshots and a `down` question; knows nothing of gRPC.
"""

from __future__ import annotations

from collections.abc import Callable

from services.common.config import RouterConfig
from services.common.errors import Overloaded, Unavailable
from services.router.policy import Loads, TierLoad

Down = Callable[[str], "str | None"]  # why a tier cannot take a call now; None if it can


# The shortest retry delay a refusal for full tiers gives; the delay is the soonest any of them
# expects a slot to free (retry_wait_s).
MIN_RETRY_S = 0.05


class TiersFull(Overloaded):
    """Every candidate tier reports a full queue; `retry_after_s` is when one may have room."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TiersLoading(Unavailable):
    """No tier of the chain may take a call now, and some are still loading their model: a
    caller with time left may wait for one to serve."""


Loading = Callable[[str], bool]  # whether a tier is still loading (will serve soon)


def never_down(tier: str) -> str | None:
    return None


def refusal(tier: str, load: TierLoad | None, config: RouterConfig, down: Down) -> str | None:
    """Why `tier` should not take one more request now, or None if it can."""
    why = down(tier)
    if why is not None:
        return why
    if load is None:
        return f"{tier} load unknown"
    if not load.serving:
        return f"{tier} not serving"
    return load_refusal(tier, load, config)


def load_refusal(tier: str, load: TierLoad, config: RouterConfig) -> str | None:
    """Why `tier`, up and serving with this load, should not take one more request now (it is
    full, refusing, or past its TTFT SLO), or None if it can."""
    if load.refusing:
        return f"{tier} refused a call at {load.running} running, {load.queued} queued"
    if load.wait_too_long:
        return (
            f"{tier} full (expected wait {load.expected_wait_ms / 1000:.2f} s over its "
            f"{load.max_wait_ms / 1000:.2f} s limit; {load.running} running, {load.queued} queued)"
        )
    if load.queue_full:
        return f"{tier} full ({load.running} running, {load.queued} queued)"
    slo = config.ttft_slo_ms.get(tier)
    if slo and load.ttft_ms_p99 > slo and load.queued > 0:
        return f"{tier} TTFT p99 {load.ttft_ms_p99:.0f} ms over its {slo:.0f} ms SLO"
    return None


def retry_wait_s(load: TierLoad) -> float:
    """When a full tier should have room: its own expected wait for a slot (measured from how
    fast its slots change hands), else its recent TTFT p50 (mostly queue wait under load)."""
    if load.expected_wait_ms > 0:
        return load.expected_wait_ms / 1000
    return load.ttft_ms_p50 / 1000


def fallback_chain(tier: str, config: RouterConfig) -> tuple[str, ...]:
    """The configured tiers after `tier` in the fallback order, each once."""
    chain: list[str] = []
    current = tier
    while (following := config.fallback.get(current)) is not None:
        if following == tier or following in chain or following not in config.tiers:
            break
        chain.append(following)
        current = following
    return tuple(chain)


def fallback_order(
    tier: str, loads: Loads, config: RouterConfig, down: Down = never_down
) -> tuple[str, ...]:
    """The tiers a failed call on `tier` moves on to: its fallback chain, those able to take a
    call now first (each group in the configured order)."""
    after = fallback_chain(tier, config)
    able = [t for t in after if refusal(t, loads.get(t), config, down) is None]
    return tuple(able + [t for t in after if t not in able])


def choose_with_fallback(
    tier: str,
    loads: Loads,
    config: RouterConfig,
    down: Down = never_down,
    loading: Loading | None = None,
) -> tuple[str, str, tuple[str, ...]]:
    """The tier to use, a note for the decision's reason ("" when no fallback happened), and
    the tiers a failed call moves on to (those able to take it first). When no tier of the
    chain can take it, the chosen tier is tried all the same and the note says so, unless every
    tier of the chain that is up reports a full queue: then TiersFull is raised; or, given
    `loading`, one of them is still loading: then TiersLoading is raised."""
    candidates = (tier, *fallback_chain(tier, config))
    refusals = {t: refusal(t, loads.get(t), config, down) for t in candidates}
    notes = []
    chosen = tier
    for candidate in candidates:
        why = refusals[candidate]
        if why is None:
            chosen = candidate
            break
        notes.append(why)
    else:
        full = [loads.get(t) for t in candidates if down(t) is None]
        if all(load is not None and load.queue_full for load in full) and full:
            wait_s = min(retry_wait_s(load) for load in full if load is not None)
            raise TiersFull(
                f"every tier full: {'; '.join(notes)}", retry_after_s=max(MIN_RETRY_S, wait_s)
            )
        if loading is not None and any(loading(t) for t in candidates):
            raise TiersLoading(f"no tier able to take it yet: {'; '.join(notes)}")
        return tier, f"; {'; '.join(notes)}; no tier available, trying {tier}", candidates[1:]
    then = fallback_order(chosen, loads, config, down)
    if chosen == tier:
        return tier, "", then
    return chosen, f"; {'; '.join(notes)} → fallback {chosen}", then
