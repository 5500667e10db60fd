"""Runs the gateway: loads its config, serves the HTTP app on uvicorn under its connection
limits (connections.py: a listening socket that admits or refuses each connection, a protocol
with header and body deadlines and keep-alive), drains on SIGTERM. At start it raises its open
files limit to the hard limit and keeps its connection cap under it
(services/common/descriptors.py).

`start_gateway` runs it inside the caller's event loop (tests use port 0); `main` is the
`python -m services.gateway` entrypoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import ProcessCollector

from services.common import env
from services.common.config import GatewayConfig
from services.common.config_loading import load_config
from services.common.descriptors import connection_cap, raise_open_files_limit
from services.common.errors import TiermeshError
from services.common.grpc_service import configure_logging
from services.common.heap import freeze_heap
from services.common.http_listener import tcp_listener
from services.common.parent_watch import stop_with_parent
from services.common.telemetry import setup_telemetry
from services.gateway.app import create_app
from services.gateway.connection_guard import ConnectionGuard, ConnectionLimits
from services.gateway.connections import (
    ConnectionMetrics,
    GuardedHttpProtocol,
    guarded_listener,
    protocol_class,
)
from services.gateway.cors import with_cors

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).with_name("config.toml")
# the connection limits' flags: each overrides the config field of the same name
LIMIT_FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--max-connections", int, "open connections cap"),
    ("--max-connections-per-client", int, "open connections cap per client address"),
    ("--header-timeout-s", float, "deadline (s) for a request's headers"),
    ("--body-timeout-s", float, "deadline (s) for a request's body after its headers"),
    ("--keepalive-timeout-s", float, "idle keep-alive timeout (s)"),
)


@dataclass
class RunningGateway:
    config: GatewayConfig
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    connections: ConnectionGuard[GuardedHttpProtocol]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


def _uvicorn_config(
    config: GatewayConfig,
) -> tuple[uvicorn.Config, ConnectionGuard[GuardedHttpProtocol]]:
    """uvicorn's config for the gateway's app, served with GuardedHttpProtocol, and the guard
    of its connections (its counts, and the process's descriptors, are in /metrics)."""
    descriptors = raise_open_files_limit()
    max_connections = connection_cap(config.max_connections, descriptors.soft)
    limits = ConnectionLimits.from_config(config, max_connections)
    guard: ConnectionGuard[GuardedHttpProtocol] = ConnectionGuard(limits)
    app = create_app(config)
    registry = app.api.state.metrics.registry
    registry.register(ConnectionMetrics(guard))
    ProcessCollector(registry=registry)  # process_open_fds, process_max_fds, CPU, memory
    log.info(
        "%s; HTTP: at most %d connections%s, %d per client; headers within %g s, body %g s, "
        "idle keep-alive %g s",
        descriptors.describe(),
        max_connections,
        "" if max_connections == config.max_connections else " (lowered to fit the limit)",
        limits.max_connections_per_client,
        limits.header_timeout_s,
        limits.body_timeout_s,
        limits.keepalive_timeout_s,
    )
    uvicorn_config = uvicorn.Config(
        with_cors(app, config.cors_origins),
        http=protocol_class(guard),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(config.drain_grace_s),
    )
    return uvicorn_config, guard


async def start_gateway(config: GatewayConfig) -> RunningGateway:
    """Starts the gateway in this event loop; port 0 binds any free port."""
    uvicorn_config, guard = _uvicorn_config(config)
    sock = guarded_listener(tcp_listener(config.host, config.port), guard)
    server = uvicorn.Server(uvicorn_config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise OSError("the gateway stopped while starting")
        await asyncio.sleep(0.01)
    return RunningGateway(config, server, task, int(sock.getsockname()[1]), guard)


_serving: list[uvicorn.Server] = []  # the server main() runs, once it serves


async def _serve(config: GatewayConfig) -> None:
    telemetry = setup_telemetry("gateway")
    uvicorn_config, guard = _uvicorn_config(config)
    sock = guarded_listener(tcp_listener(config.host, config.port), guard)
    log.info("gateway on http://%s:%d, router %s", config.host, config.port, config.router)
    server = uvicorn.Server(uvicorn_config)
    freeze_heap()  # imports and the app out of the collector's reach (services/common/heap.py)
    _serving.append(server)
    try:
        await server.serve(sockets=[sock])
    finally:
        telemetry.shutdown()


def _stop(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM. While serving, uvicorn takes them itself and drains, then raises
    the signal again here once it has: the server is told to exit (already so) and serve()
    returns, so the process ends with 0 and no task is cancelled under it. Before it serves,
    the process just ends."""
    if not _serving:
        raise SystemExit(0)
    _serving[0].should_exit = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve tiermesh's OpenAI-compatible HTTP API.")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="gateway config (TOML)")
    parser.add_argument("--host", help="override the config's host")
    parser.add_argument("--port", type=int, help="override the config's port")
    parser.add_argument("--router", help="override the config's router address")
    parser.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="a browser origin served cross-origin (repeat; replaces the config's cors_origins)",
    )
    for flag, kind, what in LIMIT_FLAGS:
        parser.add_argument(flag, type=kind, metavar="N", help=f"override the config's {what}")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        options: dict[str, Any] = {"host": args.host, "port": args.port, "router": args.router}
        for flag, _, _ in LIMIT_FLAGS:
            name = flag.removeprefix("--").replace("-", "_")
            options[name] = getattr(args, name)
        if args.cors_origin:
            options["cors_origins"] = tuple(args.cors_origin)
        config = load_config(GatewayConfig, args.config, **options)
        stop_with_parent()
        configure_logging("gateway", env.log_level())
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        asyncio.run(_serve(config))
        log.info("stopped")
    except (TiermeshError, OSError) as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2
    return 0
