"""Shared gRPC plumbing for every tiermesh server: health, reflection, binding, graceful drain.

Knows nothing of models or routing: a service hands in its servicers and gets a running server.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.errors import TiermeshError

log = logging.getLogger(__name__)

# Keepalive: every server pings idle connections and accepts the pings of CHANNEL_OPTIONS
# clients (a server refuses pings more frequent than min_recv_ping_interval with GOAWAY).
KEEPALIVE_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    *KEEPALIVE_SERVER_OPTIONS,
]
# Client channels between services: a peer that stops answering pings (hung, or its host gone)
# fails its calls within keepalive_time + keepalive_timeout, and a restarted peer is found again
# within max_reconnect_backoff instead of gRPC's default of up to two minutes.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]


def status_code(error: TiermeshError) -> grpc.StatusCode:
    """The gRPC status for one of our errors."""
    return grpc.StatusCode[error.status]


@dataclass
class RunningServer:
    """A started server, the port it is bound to and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: Sequence[str]

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def drain(self, grace_s: float) -> None:
        """Stops taking new calls, lets in-flight ones finish for up to grace_s, then stops."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start_server(
    host: str,
    port: int,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> RunningServer:
    """Builds a grpc.aio server with health (NOT_SERVING at first) and reflection, and starts it.

    `register` adds the service's servicers; `service_names` are their full names, used for
    per-service health and reflection. Port 0 binds any free port; the bound port is returned.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=list(interceptors))
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    running = RunningServer(server, bound, health_servicer, service_names)
    await running.set_serving(False)
    return running


async def wait_for_shutdown_signal() -> str:
    """Returns the name of the first SIGTERM or SIGINT this process receives."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[str] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if not received.done():
            received.set_result(sig.name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    return await received


async def serve_until_signalled(
    running: RunningServer, grace_s: float, on_stop: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Serves until SIGTERM/SIGINT, then drains in-flight streams for grace_s and stops."""
    name = await wait_for_shutdown_signal()
    log.info("%s received: draining for up to %.1f s", name, grace_s)
    await running.drain(grace_s)
    if on_stop is not None:
        await on_stop()
    log.info("stopped")


def configure_logging(service: str, level: str) -> None:
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )
