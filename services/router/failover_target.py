"""Where a chat's failed tier call goes on: another replica of its tier while one is left
untried, then the plan's fallback tiers (each at most once per chat); after a refusal for
overload only to a tier that would start it at once. The failures another tier may answer are
session_calls.FAILOVER_CODES, and a continuation a replica of another model refuses.

Pure: the chat's calls so far, its fallbacks, the tiers' replica counts and the failure in, the
next tier (or none) out; likewise for a prompt too long for a tier's model. The session core
(session_core.py) opens the call and says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from services.router.session_calls import FAILOVER_CODES, CallState, TierError


@dataclass(frozen=True)
class NextCall:
    """The tier the failed call's revision goes on on, and how reasons name it."""

    tier: str
    where: str  # "another small replica", or the tier


def failover_target(
    failed: CallState,
    error: TierError,
    continuing: bool,
    calls: Sequence[CallState],
    fallbacks: Sequence[str],
    replicas: Mapping[str, int],
    room: frozenset[str] | None,
) -> NextCall | None:
    """The next call of a revision whose call `failed` with `error` (None: nowhere, the
    revision ends there). `continuing`: the failed call was continuing a broken answer.
    `room`: after RESOURCE_EXHAUSTED, the tiers with an untried replica that would start a call
    at once (None: any)."""
    # a replica of another model refuses a continuation: that moves on too
    if error.code not in FAILOVER_CODES and not (
        continuing and error.code == "FAILED_PRECONDITION"
    ):
        return None
    if error.code != "RESOURCE_EXHAUSTED":
        room = None
    if untried(failed.tier, calls, replicas) and (room is None or failed.tier in room):
        return NextCall(failed.tier, f"another {failed.tier} replica")
    called = {c.tier for c in calls}
    left = [t for t in fallbacks if t not in called and (room is None or t in room)]
    return NextCall(left[0], left[0]) if left else None


def longer_context_tier(
    calls: Sequence[CallState], fallbacks: Sequence[str], pinned: bool
) -> str | None:
    """Where a chat goes, unseen, from a tier whose model cannot hold its prompt: the first of
    its fallbacks not yet called (None: nowhere, and never for a pinned chat)."""
    called = {c.tier for c in calls}
    left = [tier for tier in fallbacks if tier not in called]
    return left[0] if left and not pinned else None


def widest_refusal(
    too_long: Sequence[TierError], calls: Sequence[CallState]
) -> tuple[str, TierError]:
    """The failure a chat ends with when no tier it tried could hold its prompt (`too_long`,
    their refusals, not empty): the refusal of the tier with the largest context, saying so."""
    widest = max(too_long, key=lambda e: int(e.metadata.get("limit_tokens", 0)))
    tier = next(c.tier for c in calls if c.error is widest)
    prompt, limit = (widest.metadata.get(k) for k in ("prompt_tokens", "limit_tokens"))
    details = (
        f"prompt: {prompt} tokens exceeds the largest context of the tiers that could "
        f"take it ({limit} tokens)"
    )
    return tier, replace(widest, details=details)


def untried(tier: str, calls: Sequence[CallState], replicas: Mapping[str, int]) -> bool:
    """Whether a replica of `tier` has not had a call of this chat yet."""
    tried = {c.endpoint for c in calls if c.tier == tier}
    return replicas.get(tier, 1) > len(tried)


def who(call: CallState, replicas: Mapping[str, int]) -> str:
    """The call's tier, and its replica when the tier has several."""
    if replicas.get(call.tier, 1) > 1:
        return f"{call.tier} ({call.endpoint})"
    return call.tier
