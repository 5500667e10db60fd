"""Publishes whether each tier can take a call as the router's gRPC health, one service name per
tier (`tiermesh.tier.<name>`: SERVING while a replica of it may take a new call, NOT_SERVING with
none), so that a caller's health check (the gateway's `/health`, a probe, grpcurl) sees the tiers
behind the router, not only the router itself; and, with metrics on, as the gauge
`tiermesh.router.tier.serving` (1 or 0 per `tiermesh.tier`), for alerts.

Reads tier_health.TierHealth; writes nothing but health statuses and what the gauge reports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from grpc_health.v1 import health, health_pb2
from opentelemetry.metrics import CallbackOptions, Observation

from services.common.telemetry import meter
from services.common.tiers import tier_health_name

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class TierServing:
    """Each tier's last published health (tier -> serving), as the serving gauge reports it.
    Written on the event loop, read from the metric reader's thread: a dict replaced whole."""

    def __init__(self) -> None:
        self.serving: dict[str, bool] = {}

    def register_gauge(self) -> None:
        """Registers `tiermesh.router.tier.serving` with this process's meter."""

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            for tier, serving in self.serving.items():
                yield Observation(1 if serving else 0, {"tiermesh.tier": tier})

        meter().create_observable_gauge(
            "tiermesh.router.tier.serving",
            callbacks=[observe],
            description="1 while some replica of the tier may take a call, else 0",
        )


async def publish_tier_health(
    servicer: health.aio.HealthServicer,
    tiers: Iterable[str],
    down: Callable[[str], str | None],
    interval_s: float,
    serving: TierServing,
) -> None:
    """Sets each tier's health now and again whenever it changes, checking every `interval_s`,
    until cancelled; `serving` keeps what was last published. `down(tier)` says why the tier
    may not take a call, None when it may."""
    names = list(tiers)
    while True:
        for tier in names:
            why = down(tier)
            if serving.serving.get(tier) == (why is None):
                continue
            if tier in serving.serving:
                log.info("tier %s %s", tier, "serving" if why is None else f"down: {why}")
            await servicer.set(tier_health_name(tier), SERVING if why is None else NOT_SERVING)
            serving.serving = {**serving.serving, tier: why is None}
        await asyncio.sleep(interval_s)
