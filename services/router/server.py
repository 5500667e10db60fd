"""Runs the router: loads its config, connects to the tiers, serves RouterService, drains.

The router is a light process: it speaks gRPC only and never imports torch or an engine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
from tiermesh.v1 import router_pb2

from services.common import env
from services.common.answers import answers_agree
from services.common.config import RouterConfig
from services.common.config_loading import load_config
from services.common.errors import TiermeshError
from services.common.grpc_service import (
    RunningServer,
    configure_logging,
    lenient_deserializer,
    serve_until_signalled,
    start_server,
)
from services.common.heap import freeze_heap
from services.common.parent_watch import stop_with_parent
from services.common.telemetry import metrics_on, setup_telemetry
from services.router.outlier import OutlierDetector
from services.router.policy_factory import create_policy
from services.router.servicer import RouterServicer
from services.router.tier_calls import TierChannels
from services.router.tier_health import TierHealth
from services.router.tier_loads import TierLoadWatcher
from services.router.tier_readiness import TierServing, publish_tier_health
from services.router.xds_readiness import XdsReadiness
from services.security.settings import ServiceSecurity

log = logging.getLogger(__name__)

SERVICE_NAME = router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name
DEFAULT_CONFIG = Path(__file__).with_name("config.toml")
FIRST_REPORTS_S = 2.0  # at start, how long to wait for every tier's first load report
# new tracked objects before the collector's youngest pass (CPython: 700). At 1,000 echo streams
# (README, Performance; six runs of each build alternated): router CPU per chat 5% lower in every
# pair, first-token p99 overhead median 25.8 ms against 34.5 with the default.
ROUTER_YOUNG_OBJECTS = 20_000


@dataclass
class RouterServer:
    config: RouterConfig
    servicer: RouterServicer
    channels: TierChannels
    running: RunningServer
    watcher: TierLoadWatcher
    readiness: asyncio.Task[None] | None = None  # mesh mode: SERVING once xDS resources are in
    tier_health: asyncio.Task[None] | None = None  # each tier's health (tier_readiness.py)

    def _stop_tasks(self) -> None:
        for task in (self.readiness, self.tier_health):
            if task is not None:
                task.cancel()

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.running.port}"

    async def close_upstream(self) -> None:
        self._stop_tasks()
        await self.watcher.stop()
        await self.channels.close()

    async def stop(self, grace_s: float | None = None) -> None:
        await self.running.drain(self.config.drain_grace_s if grace_s is None else grace_s)
        self._stop_tasks()
        await self.watcher.stop()
        await self.channels.close()


def add_router_service(servicer: RouterServicer, server: grpc.aio.Server) -> None:
    """Registers RouterService as the generated add_RouterServiceServicer_to_server does, but
    with lenient request deserializers: a request that does not decode (a string field with
    bad UTF-8, say) reaches the servicer, which answers INVALID_ARGUMENT naming the field."""
    handlers = {
        "Chat": grpc.unary_stream_rpc_method_handler(
            servicer.Chat,
            request_deserializer=lenient_deserializer(router_pb2.ChatRequest),
            response_serializer=router_pb2.ChatEvent.SerializeToString,
        ),
        "Feedback": grpc.unary_unary_rpc_method_handler(
            servicer.Feedback,
            request_deserializer=lenient_deserializer(router_pb2.FeedbackRequest),
            response_serializer=router_pb2.FeedbackResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


async def start_router(
    config: RouterConfig, security: ServiceSecurity | None = None
) -> RouterServer:
    """Starts the router; `security` (TLS, API keys) from the environment in `main`, plaintext
    and no keys when None."""
    security = security or ServiceSecurity()
    security.check_listen(config.host, "router")
    channels = TierChannels(config.tiers, security.channel_credentials())
    watcher = TierLoadWatcher(
        channels, config.load_watch_interval_ms, config.load_stale_ms, config.loading_wait_s
    )
    outliers = OutlierDetector(
        config.eject_after_failures,
        config.ejection_base_ms / 1000,
        config.ejection_max_ms / 1000,
        probe_timeout_s=config.stall_timeout_ms / 1000,
    )
    health = TierHealth(channels.replicas, watcher, outliers)
    channels.picker = health.pick
    channels.on_call = watcher.track_call
    servicer = RouterServicer(
        config,
        channels,
        create_policy(config),
        watcher.loads,
        answers_agree=answers_agree,
        health=health,
    )
    running = await start_server(
        config.host,
        config.port,
        lambda server: add_router_service(servicer, server),
        [SERVICE_NAME],
        interceptors=security.interceptors(),
        credentials=security.server_credentials(),
        reflection_on=security.reflection,
    )
    watcher.start()
    await watcher.first_reports(FIRST_REPORTS_S)
    router = RouterServer(config, servicer, channels, running, watcher)
    serving = TierServing()
    if metrics_on():
        serving.register_gauge()
    router.tier_health = asyncio.create_task(
        publish_tier_health(
            running.health,
            channels.replicas,
            health.down,
            config.load_watch_interval_ms / 1000,
            serving,
        )
    )
    endpoints = [e for es in channels.replicas.values() for e in es]
    readiness = XdsReadiness({e: channels.channel(e) for e in endpoints})
    if readiness.needed:  # mesh mode: NOT_SERVING until the xDS client has every tier's config
        router.readiness = asyncio.create_task(readiness.serve_when_ready(running.set_serving))
    else:
        await running.set_serving(True)
    return router


def parse_tier_targets(values: list[str]) -> dict[str, str] | None:
    if not values:
        return None
    targets = {}
    for value in values:
        tier, _, target = value.partition("=")
        if not target:
            raise TiermeshError(f"--tier: expected NAME=TARGET, got {value!r}")
        targets[tier] = target
    return targets


async def _serve(config: RouterConfig, security: ServiceSecurity) -> None:
    telemetry = setup_telemetry("router", prometheus_port=config.metrics_port)
    # imports and set-up out of the collector's reach, and fewer passes over open streams
    freeze_heap(young_objects=ROUTER_YOUNG_OBJECTS)  # (services/common/heap.py)
    router = await start_router(config, security)
    log.info("router on %s, tiers %s", router.address, config.tiers)
    await serve_until_signalled(router.running, config.drain_grace_s, router.close_upstream)
    telemetry.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the tiermesh router over gRPC.")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="router config (TOML)")
    parser.add_argument("--port", type=int, help="override the config's port")
    parser.add_argument("--host", help="override the config's host")
    parser.add_argument("--metrics-port", type=int, help="override the config's metrics_port")
    parser.add_argument("--max-inflight", type=int, help="override the config's max_inflight")
    parser.add_argument("--policy", help="override the config's routing policy")
    parser.add_argument(
        "--progressive-gate",
        help="override the config's progressive gate (always, race, cascade, escalate)",
    )
    parser.add_argument(
        "--tier", action="append", default=[], help="NAME=TARGET, overrides one tier's address"
    )
    parser.add_argument(
        "--insecure", action="store_true", help="allow plaintext on a non-loopback address"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        overrides = parse_tier_targets(args.tier)
        options = {
            "port": args.port,
            "host": args.host,
            "metrics_port": args.metrics_port,
            "max_inflight": args.max_inflight,
            "policy": args.policy,
            "progressive_gate": args.progressive_gate,
        }
        config = load_config(RouterConfig, args.config, **options)
        if overrides:
            tiers = {**config.tiers, **overrides}
            config = load_config(RouterConfig, args.config, **options, tiers=tiers)
        security = ServiceSecurity.from_env()
        if args.insecure:
            security = replace(security, insecure=True)
        stop_with_parent()
        configure_logging("router", env.log_level())
        asyncio.run(_serve(config, security))
    except TiermeshError as e:
        print(f"router: {e}", file=sys.stderr)
        return 2
    return 0
