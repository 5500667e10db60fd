"""Under overload, step down instead of shedding: a routed chat whose chosen tier is up but
cannot start it within its budget (full, refusing, past its TTFT SLO, or expecting a wait for a
slot longer than the chat's budget) goes to the next smaller tier that can, else the next larger
one. The chat's priority decides who moves: interactive chats step down; batch chats keep their
tier (queued there) and are refused first when it is full or people's chats wait there; critical
chats keep their tier while it serves, even when it reads full (its queue takes them first),
whatever `overload` says.

Pure decision logic over TierLoad snapshots and a `down` question; knows nothing of gRPC. A tier
that is down is not this module's business: the fallback chain (fallback.py) handles it.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import RouterConfig
from services.common.tiers import TIER_NAMES
from services.router.fallback import MIN_RETRY_S, Down, TiersFull, load_refusal, retry_wait_s
from services.router.policy import Loads, TierLoad

INTERACTIVE, BATCH, CRITICAL = "interactive", "batch", "critical"
PRIORITIES = (BATCH, INTERACTIVE, CRITICAL)  # lowest first: a key's ceiling allows those below


class OverFairShare(TiersFull):
    """Under load, the chat's API key already holds more than its fair part of the chats in
    flight at its priority: refused at once (RESOURCE_EXHAUSTED, ErrorInfo FAIR_SHARE)."""

    reason = "FAIR_SHARE"


@dataclass(frozen=True)
class Step:
    """The chat moves from `stepped_from` (the policy's choice) to `tier`, for `reason`."""

    tier: str
    stepped_from: str
    reason: str  # "stepped down from large: large full (8 running, 16 queued)"


@dataclass(frozen=True)
class Keep:
    """The chat stays on `tier` even when it reads full, with no fallback choice: the tier's
    queue takes it before lower priorities, in a waiting one's place if it must (a critical
    chat; the tier's queue_order.py)."""

    tier: str


def late(tier: str, load: TierLoad, config: RouterConfig, budget_ms: float | None) -> str | None:
    """Why `tier` (up, with this load) would not start one more chat within `budget_ms` (None:
    no budget), or None if it would."""
    why = load_refusal(tier, load, config)
    if why is not None:
        return why
    if budget_ms is not None and load.queued > 0 and load.expected_wait_ms > budget_ms:
        return (
            f"{tier} expected wait {load.expected_wait_ms:.0f} ms over the chat's "
            f"{budget_ms:.0f} ms budget"
        )
    return None


def step_for_load(
    chosen: str,
    loads: Loads,
    config: RouterConfig,
    down: Down,
    priority: str,
    budget_ms: float | None,
    over_share: bool = False,
) -> Step | Keep | None:
    """Where a routed chat the policy sent to `chosen` goes when `chosen` cannot start it in
    time: a Step to another tier; Keep for a critical chat while `chosen` is up and serving
    (full or not, step_down or shed); None when the fallback choice decides (it can start it,
    it is down, overload is "shed", a batch chat waits there, or no other tier can either).
    Raises TiersFull for a batch chat whose tier is full, and OverFairShare for a chat whose
    API key holds more than its part (`over_share`)."""
    if priority == CRITICAL:
        load = loads.get(chosen)
        serving = down(chosen) is None and load is not None and load.serving
        return Keep(chosen) if serving else None
    if config.overload != "step_down" or down(chosen) is not None:
        return None
    load = loads.get(chosen)
    if load is None or not load.serving:
        return None
    people = load.queued - load.queued_batch
    if priority == BATCH and people > 0:
        # the tier queues no batch request behind them (its queue_order.may_queue); a slot
        # free while they wait is one kept for critical requests
        retry_s = max(MIN_RETRY_S, retry_wait_s(load))
        raise TiersFull(
            f"batch chat refused: {chosen} has {people} interactive or critical requests "
            f"waiting ({load.running} running)",
            retry_after_s=retry_s,
        )
    why = late(chosen, load, config, budget_ms)
    if why is None:
        return None
    if over_share:  # its key takes more than its part: the others keep the room left
        retry_s = max(MIN_RETRY_S, retry_wait_s(load))
        raise OverFairShare(f"over this API key's fair share under load: {why}", retry_s)
    if priority == BATCH:  # queued on its own tier; refused first once that is full
        if load.queue_full:
            retry_s = max(MIN_RETRY_S, retry_wait_s(load))
            raise TiersFull(f"batch chat refused: {why}", retry_after_s=retry_s)
        return None
    rank = TIER_NAMES.index(chosen)
    smaller = [t for t in reversed(TIER_NAMES[:rank]) if t in config.tiers]
    larger = [t for t in TIER_NAMES[rank + 1 :] if t in config.tiers]
    for tier in (*smaller, *larger):
        other = loads.get(tier)
        able = down(tier) is None and other is not None and other.serving
        if able and other is not None and late(tier, other, config, budget_ms) is None:
            direction = "down" if tier in smaller else "up"
            return Step(tier, chosen, f"stepped {direction} from {chosen}: {why}")
    return None


def under_load(
    chosen: str, loads: Loads, config: RouterConfig, down: Down, budget_ms: float | None
) -> bool:
    """Whether `chosen`, up and serving, would not start one more chat within `budget_ms`."""
    load = loads.get(chosen)
    serving = load is not None and load.serving and down(chosen) is None
    return serving and load is not None and late(chosen, load, config, budget_ms) is not None


def max_tokens_under_load(
    max_tokens: int, max_tokens_set: bool, priority: str, pressed: bool, config: RouterConfig
) -> int:
    """The max_tokens a routed chat runs with: under load (`pressed`: the tier its policy
    chose could not start it in time), one that left max_tokens to the router and is not
    critical gets at most `overload_max_tokens` (0: never lowered); else its own."""
    limit = config.overload_max_tokens
    if not pressed or max_tokens_set or priority == CRITICAL or limit <= 0:
        return max_tokens
    return min(max_tokens, limit)


def priority_allowed(priority: str, ceiling: str | None) -> bool:
    """Whether a caller whose ceiling is `ceiling` (None: any) may ask for `priority`."""
    return ceiling is None or PRIORITIES.index(priority) <= PRIORITIES.index(ceiling)


# The router's own limit (max_inflight) by priority: batch may fill this share of it, interactive
# all but the critical reserve, critical all of it; so a flood of batch leaves room for people,
# and a flood of interactive leaves room for critical.
BATCH_SHARE = 0.5
CRITICAL_RESERVE = 0.1


def inflight_limit(priority: str, max_inflight: int) -> int:
    """How many chats may be in flight at the router when a chat of `priority` arrives."""
    if priority == CRITICAL:
        return max_inflight
    if priority == BATCH:
        return max(1, int(max_inflight * BATCH_SHARE))
    return max(1, max_inflight - int(max_inflight * CRITICAL_RESERVE))
