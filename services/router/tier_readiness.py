"""Publishes whether each tier can take a call as the router's gRPC health, one service name per
tier (`tiermesh.tier.<name>`: SERVING while a replica of it may take a new call, NOT_SERVING with
none), so that a caller's health check (the gateway's `/health`, a probe, grpcurl) sees the tiers
behind the router, not only the router itself.

Reads tier_health.TierHealth; writes nothing but health statuses.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from grpc_health.v1 import health, health_pb2

from services.common.tiers import tier_health_name

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def publish_tier_health(
    servicer: health.aio.HealthServicer,
    tiers: Iterable[str],
    down: Callable[[str], str | None],
    interval_s: float,
) -> None:
    """Sets each tier's health now and again whenever it changes, checking every `interval_s`,
    until cancelled. `down(tier)` says why the tier may not take a call, None when it may."""
    names = list(tiers)
    published: dict[str, int] = {}
    while True:
        for tier in names:
            why = down(tier)
            status = SERVING if why is None else NOT_SERVING
            if published.get(tier) != status:
                if tier in published:
                    log.info("tier %s %s", tier, "serving" if why is None else f"down: {why}")
                await servicer.set(tier_health_name(tier), status)
                published[tier] = status
        await asyncio.sleep(interval_s)
