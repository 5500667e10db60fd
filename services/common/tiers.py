"""The names of the model tiers, the one vocabulary every config, CLI, JSON and metric uses."""

from __future__ import annotations

from services.common.errors import InvalidArgument

TIER_NAMES: tuple[str, ...] = ("small", "medium", "large")


def check_tier(name: str, field: str) -> str:
    """Returns `name` if it is a tier name, else raises InvalidArgument naming `field`."""
    if name not in TIER_NAMES:
        raise InvalidArgument(
            f"{field}: unknown tier {name!r} (expected one of {', '.join(TIER_NAMES)})"
        )
    return name


def tier_health_name(tier: str) -> str:
    """The gRPC health service name under which the router reports whether `tier` can take a
    call (SERVING while a replica of it may, NOT_SERVING with none)."""
    return f"tiermesh.tier.{tier}"
