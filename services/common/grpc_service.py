"""Shared gRPC plumbing for every tiermesh server: health, reflection, binding, graceful drain,
and the limits every server holds its connections to (`ServerLimits`).

Knows nothing of models or routing: a service hands in its servicers and gets a running server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.descriptors import connection_cap, raise_open_files_limit
from services.common.errors import ConfigError, TiermeshError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)

# Keepalive: every server pings idle connections and accepts the pings of CHANNEL_OPTIONS
# clients (every 10 s, with or without calls). A client that pings more often than every 5 s
# while no data flows gets a strike; past 2 strikes the server answers GOAWAY `too_many_pings`
# and closes the connection. grpcio 1.85 reads the minimum interval from
# `grpc.http2.min_ping_interval_without_data_ms` (the string of C-core's
# GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS): a `min_recv_...` spelling is ignored
# and leaves grpc's 5-minute default (tests/integration/test_grpc_connection_limits.py).
KEEPALIVE_SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 2),
]
# Connection age: a server sends GOAWAY to a connection after 30 minutes (and lets its streams
# finish for up to 5 more), so long-lived clients reconnect and spread over new replicas
# behind a load balancer instead of staying pinned to the first ones forever.
CONNECTION_AGE_OPTIONS = [
    ("grpc.max_connection_age_ms", 30 * 60_000),
    ("grpc.max_connection_age_grace_ms", 5 * 60_000),
]
SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
    *KEEPALIVE_SERVER_OPTIONS,
    *CONNECTION_AGE_OPTIONS,
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


@dataclass(frozen=True)
class ServerLimits:
    """What connections may hold of a gRPC server, so that slow or half-open ones cannot take
    its descriptors or its memory; every field is a grpc core channel argument that grpcio 1.85
    honours (each checked by experiment in tests/integration/test_grpc_connection_limits.py).
    Read from the environment by `from_env` (TIERMESH_GRPC_*), which every service does.

    gRPC has no per-peer connection cap: per-address limits belong in front of the router (the
    gateway's, a load balancer's, or the host firewall's, e.g. iptables `connlimit`)."""

    # connections open at once (`grpc.max_allowed_incoming_connections`); past it a new one is
    # closed as soon as it is accepted. Lowered at start to stay under the open files limit
    # (services/common/descriptors.py).
    max_connections: int = 4096
    # from accept to the client's HTTP/2 SETTINGS, TLS included
    # (`grpc.server_handshake_timeout_ms`, grpc's default 120 s): an unfinished preface is
    # closed after it
    handshake_timeout_s: float = 5.0
    # concurrent calls on one connection (`grpc.max_concurrent_streams`, grpc's default
    # unlimited): above every admission limit of the services here, since a router or gateway
    # multiplexes all its calls over one connection; it bounds what one client can pin. A client
    # past it may see UNAVAILABLE (RST_STREAM REFUSED_STREAM) rather than wait.
    max_streams_per_connection: int = 4096
    # a connection with no call for this long gets GOAWAY (`grpc.max_connection_idle_ms`); a
    # channel reconnects at its next call. 0: never
    idle_timeout_s: float = 300.0

    def validate(self) -> None:
        checks = (
            (self.max_connections >= 1, "TIERMESH_GRPC_MAX_CONNECTIONS", "must be >= 1"),
            (self.handshake_timeout_s > 0, "TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S", "must be > 0"),
            (self.max_streams_per_connection >= 1, "TIERMESH_GRPC_MAX_STREAMS", "must be >= 1"),
            (self.idle_timeout_s >= 0, "TIERMESH_GRPC_IDLE_TIMEOUT_S", "must be >= 0"),
        )
        for ok, name, message in checks:
            if not ok:
                raise ConfigError(f"{name}: {message}")

    @classmethod
    def from_env(cls) -> ServerLimits:
        """The defaults, with each TIERMESH_GRPC_* variable that is set over its field;
        ConfigError naming the variable on a bad value."""
        read: list[tuple[str, str, type, str | None]] = [
            # (field, variable, type, value): each variable read by name (env.py's registry)
            (
                "max_connections",
                "TIERMESH_GRPC_MAX_CONNECTIONS",
                int,
                os.environ.get("TIERMESH_GRPC_MAX_CONNECTIONS"),
            ),
            (
                "handshake_timeout_s",
                "TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S",
                float,
                os.environ.get("TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S"),
            ),
            (
                "max_streams_per_connection",
                "TIERMESH_GRPC_MAX_STREAMS",
                int,
                os.environ.get("TIERMESH_GRPC_MAX_STREAMS"),
            ),
            (
                "idle_timeout_s",
                "TIERMESH_GRPC_IDLE_TIMEOUT_S",
                float,
                os.environ.get("TIERMESH_GRPC_IDLE_TIMEOUT_S"),
            ),
        ]
        fields: dict[str, Any] = {}
        for field_name, name, kind, value in read:
            if value is None or not value.strip():
                continue
            try:
                fields[field_name] = kind(value.strip())
            except ValueError:
                raise ConfigError(f"{name}: expected a number, got {value!r}") from None
        limits = cls(**fields)
        limits.validate()
        return limits

    def options(self, max_connections: int) -> list[tuple[str, int]]:
        """The channel arguments, with the connection cap `max_connections` (after
        `descriptors.connection_cap`)."""
        options = [
            ("grpc.max_allowed_incoming_connections", max_connections),
            ("grpc.server_handshake_timeout_ms", round(self.handshake_timeout_s * 1000)),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
        ]
        if self.idle_timeout_s > 0:
            options.append(("grpc.max_connection_idle_ms", round(self.idle_timeout_s * 1000)))
        return options


@dataclass(frozen=True)
class Undecodable:
    """What a lenient deserializer hands the handler for bytes that are not a valid request:
    the handler answers INVALID_ARGUMENT with `message` (gRPC itself would answer UNKNOWN
    before the handler ran)."""

    message: str


def lenient_deserializer(cls: type[M]) -> Callable[[bytes], M | Undecodable]:
    """A request deserializer for `cls` that turns a decode error into Undecodable, naming
    the string field whose bytes are not UTF-8 when that is the cause."""

    def parse(data: bytes) -> M | Undecodable:
        try:
            return cls.FromString(data)
        except DecodeError as e:
            field = bad_utf8_field(cls.DESCRIPTOR, data)
            if field is not None:
                return Undecodable(f"{field}: not valid UTF-8")
            return Undecodable(f"request: not a valid {cls.DESCRIPTOR.full_name} ({e})")

    return parse


def bad_utf8_field(descriptor: Any, data: bytes, prefix: str = "") -> str | None:
    """The path (e.g. "messages[1].content") of the first string field in the wire bytes of
    a message of `descriptor` (a protobuf Descriptor) whose value is not UTF-8; None if there is
    none or the bytes are malformed otherwise."""
    seen: dict[int, int] = {}
    name = ""
    i = 0
    try:
        while i < len(data):
            key, i = _varint(data, i)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, i = _varint(data, i)
            elif wire_type in (1, 5):
                i += 8 if wire_type == 1 else 4
            elif wire_type == 2:
                length, i = _varint(data, i)
                value, i = data[i : i + length], i + length
                field = descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                name = prefix + str(field.name)
                if field.is_repeated:
                    seen[number] = seen.get(number, -1) + 1
                    name += f"[{seen[number]}]"
                if field.type == FieldDescriptor.TYPE_STRING:
                    value.decode("utf-8")
                elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type:
                    found = bad_utf8_field(field.message_type, value, name + ".")
                    if found is not None:
                        return found
            else:
                return None
    except UnicodeDecodeError:
        return name
    except IndexError:
        return None
    return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


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
    credentials: grpc.ServerCredentials | None = None,
    reflection_on: bool = True,
    limits: ServerLimits | None = None,
) -> RunningServer:
    """Builds a grpc.aio server with health (NOT_SERVING at first) and reflection, and starts it.

    `register` adds the service's servicers; `service_names` are their full names, used for
    per-service health and reflection. Port 0 binds any free port; the bound port is returned.
    With `credentials` the port speaks TLS only; `reflection_on=False` leaves reflection off.
    `limits` bound its connections (None: `ServerLimits.from_env()`); the process's open files
    limit is raised to its hard limit first, and the connection cap kept under it.
    """
    limits = limits if limits is not None else ServerLimits.from_env()
    descriptors = raise_open_files_limit()
    max_connections = connection_cap(limits.max_connections, descriptors.soft)
    options = [*SERVER_OPTIONS, *limits.options(max_connections)]
    server = grpc.aio.server(options=options, interceptors=list(interceptors))
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection_on:
        reflection.enable_server_reflection(
            [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
    address = f"{host}:{port}"
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    log.info(
        "%s; gRPC on %s:%d: at most %d connections%s, %g s to finish a handshake, "
        "%d calls per connection",
        descriptors.describe(),
        host,
        bound,
        max_connections,
        "" if max_connections == limits.max_connections else " (lowered to fit the limit)",
        limits.handshake_timeout_s,
        limits.max_streams_per_connection,
    )
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
