"""Where a failed tier call goes on (services/router/failover_target.py): a table of failures,
the calls a chat has made, its fallbacks, the tiers' replicas and their room, against the next
tier and how reasons name it; where a prompt too long for a tier goes, and the failure a chat
ends with when no tier could hold it."""

from __future__ import annotations

import pytest

from services.router.failover_target import (
    NextCall,
    failover_target,
    longer_context_tier,
    untried,
    who,
    widest_refusal,
)
from services.router.session_calls import CallState, TierError

UNAVAILABLE = TierError("UNAVAILABLE", "connection refused")
FULL = TierError("RESOURCE_EXHAUSTED", "queue full", reason="OVERLOADED")
BAD = TierError("INVALID_ARGUMENT", "max_tokens: too many")
OTHER_MODEL = TierError("FAILED_PRECONDITION", "another model")


def calls(*tiers: str) -> list[CallState]:
    """The chat's calls, each on its tier's replica n (its place among that tier's calls)."""
    out: list[CallState] = []
    for i, tier in enumerate(tiers):
        n = sum(1 for c in out if c.tier == tier)
        out.append(CallState(i, tier, f"r-{i}", None, endpoint=f"{tier}-{n}"))
    return out


# (failure, continuing, calls made (the last failed), fallbacks, replicas, room, next)
CASES = [
    (
        UNAVAILABLE,
        False,
        ("large",),
        ("medium", "small"),
        {"large": 2},
        None,
        NextCall("large", "another large replica"),
    ),
    (
        UNAVAILABLE,
        False,
        ("large", "large"),
        ("medium", "small"),
        {"large": 2},
        None,
        NextCall("medium", "medium"),
    ),
    (
        UNAVAILABLE,
        False,
        ("large", "medium"),
        ("medium", "small"),
        {},
        None,
        NextCall("small", "small"),
    ),
    (UNAVAILABLE, False, ("large", "medium", "small"), ("medium", "small"), {}, None, None),
    (BAD, False, ("large",), ("medium",), {"large": 2}, None, None),  # fails anywhere alike
    (OTHER_MODEL, False, ("large",), ("medium",), {"large": 2}, None, None),
    (
        OTHER_MODEL,
        True,
        ("large",),
        ("medium",),
        {"large": 2},
        None,
        NextCall("large", "another large replica"),
    ),  # continuing: another replica may hold it
    # full: only where a call would start at once
    (
        FULL,
        False,
        ("large",),
        ("medium", "small"),
        {"large": 2},
        frozenset({"small"}),
        NextCall("small", "small"),
    ),
    (FULL, False, ("large",), ("medium", "small"), {"large": 2}, frozenset(), None),
    # room is read only for a refusal for overload
    (UNAVAILABLE, False, ("large",), ("medium",), {}, frozenset(), NextCall("medium", "medium")),
]


@pytest.mark.parametrize(
    ("error", "continuing", "made", "fallbacks", "replicas", "room", "to"), CASES
)
def test_where_a_failed_call_goes_on(
    error: TierError,
    continuing: bool,
    made: tuple[str, ...],
    fallbacks: tuple[str, ...],
    replicas: dict[str, int],
    room: frozenset[str] | None,
    to: NextCall | None,
) -> None:
    chat = calls(*made)
    assert failover_target(chat[-1], error, continuing, chat, fallbacks, replicas, room) == to


def test_replicas_tried_and_named() -> None:
    chat = calls("small", "small")
    assert not untried("small", chat, {"small": 2}) and untried("small", chat, {"small": 3})
    assert untried("large", chat, {})
    assert who(chat[1], {"small": 2}) == "small (small-1)" and who(chat[1], {}) == "small"


# (calls made, fallbacks, pinned, next tier)
LONGER_CONTEXT = [
    (("small",), ("medium", "large"), False, "medium"),
    (("small", "medium"), ("medium", "large"), False, "large"),
    (("large", "small"), ("small", "medium"), False, "medium"),  # a tier called is not again
    (("small", "medium", "large"), ("medium", "large"), False, None),
    (("small",), (), False, None),
    (("small",), ("medium", "large"), True, None),  # a pinned chat stays on its tier
]


@pytest.mark.parametrize(("made", "fallbacks", "pinned", "to"), LONGER_CONTEXT)
def test_where_a_prompt_too_long_goes(
    made: tuple[str, ...], fallbacks: tuple[str, ...], pinned: bool, to: str | None
) -> None:
    assert longer_context_tier(calls(*made), fallbacks, pinned) == to


def too_long(prompt: int, limit: int) -> TierError:
    metadata = {"prompt_tokens": str(prompt), "limit_tokens": str(limit)}
    details = f"prompt: {prompt} tokens exceeds the context ({limit} tokens)"
    return TierError("INVALID_ARGUMENT", details, reason="PROMPT_TOO_LONG", metadata=metadata)


def test_a_prompt_no_tier_holds_fails_with_the_widest_context() -> None:
    chat = calls("small", "large", "medium")
    refusals = [too_long(900, 256), too_long(900, 512), too_long(900, 384)]
    for call, refusal in zip(chat, refusals, strict=True):
        call.error = refusal
    tier, error = widest_refusal(refusals, chat)
    assert tier == "large"
    assert error.details == (
        "prompt: 900 tokens exceeds the largest context of the tiers that could take it "
        "(512 tokens)"
    )
    assert (error.code, error.reason, error.metadata) == (
        "INVALID_ARGUMENT",
        "PROMPT_TOO_LONG",
        refusals[1].metadata,
    )
