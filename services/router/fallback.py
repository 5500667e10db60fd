"""Load-aware fallback: when the chosen tier, by its own load report, would break its TTFT SLO
or has no room, the request goes to the next tier in the configured fallback order.

Pure decision logic over TierLoad snapshots; knows nothing of gRPC.
"""

from __future__ import annotations

from services.common.config import RouterConfig
from services.router.policy import Loads, TierLoad


def overloaded(tier: str, load: TierLoad | None, config: RouterConfig) -> str | None:
    """Why `tier` should not take one more request now, or None if it can (or is unknown)."""
    if load is None:
        return None
    if not load.serving:
        return f"{tier} not serving"
    if load.queue_full:
        return f"{tier} full ({load.running} running, {load.queued} queued)"
    slo = config.ttft_slo_ms.get(tier)
    if slo and load.ttft_ms_p99 > slo and load.queued > 0:
        return f"{tier} TTFT p99 {load.ttft_ms_p99:.0f} ms over its {slo:.0f} ms SLO"
    return None


def choose_with_fallback(tier: str, loads: Loads, config: RouterConfig) -> tuple[str, str]:
    """The tier to use and a note for the decision's reason ("" when no fallback happened)."""
    seen = [tier]
    notes = []
    current = tier
    while (why := overloaded(current, loads.get(current), config)) is not None:
        notes.append(why)
        following = config.fallback.get(current)
        if following is None or following in seen or following not in config.tiers:
            return tier, f"; {'; '.join(notes)}, no fallback left"
        seen.append(following)
        current = following
    if current == tier:
        return tier, ""
    return current, f"; {'; '.join(notes)} → fallback {current}"
