"""The control plane's process: reads the topology file, turns it into one snapshot per node group
(proxyless gRPC clients, Envoy), publishes them, and reloads when the file changes. A file that
is invalid, or that yields an inconsistent snapshot, is refused with its error recorded; the last
good snapshot keeps serving. Each published topology is also saved beside the file
(`mesh.last_good`), so a restarted control plane whose file has since become invalid serves that
one, and says so in its log and status.

Serves ADS, the mesh admin service and gRPC health on one port. Knows nothing of the wire details
of ADS (see `mesh.ads`) or of how resources are shaped (see `mesh.resources`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envoy.service.discovery.v3 import ads_pb2, ads_pb2_grpc  # type: ignore[import-untyped]
from tiermesh.v1 import mesh_pb2, mesh_pb2_grpc

from mesh.admin import MeshAdminServicer, control_plane_interceptors
from mesh.ads import AggregatedDiscoveryServicer
from mesh.last_good import load_or_last_good, save_last_good
from mesh.node_status import NodeStatusBook
from mesh.resources import ENVOY, FLAVOURS, PROXYLESS, build_resources
from mesh.snapshot import InconsistentSnapshot, Snapshot, SnapshotCache
from mesh.topology import Endpoint, Topology
from mesh.topology_file import load_topology
from services.common.errors import ConfigError
from services.common.grpc_service import RunningServer, start_server
from services.security.settings import ServiceSecurity

log = logging.getLogger(__name__)

ADS_SERVICE = ads_pb2.DESCRIPTOR.services_by_name["AggregatedDiscoveryService"].full_name
ADMIN_SERVICE = mesh_pb2.DESCRIPTOR.services_by_name["MeshAdminService"].full_name
POLL_INTERVAL_S = 0.2
RESOLVE_INTERVAL_S = 10.0  # how often DNS names in the topology are looked up again

Resolver = Callable[[str, int], list[str]]  # host, port -> IP addresses


def node_group(node: Any) -> str:
    """Envoy (which names itself "envoy") gets socket listeners; every other node, the
    proxyless gRPC listeners."""
    return ENVOY if node.user_agent_name == "envoy" else PROXYLESS


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def has_host_names(topology: Topology) -> bool:
    return any(not _is_ip(e.host) for c in topology.clusters for e in c.endpoints)


def resolve_hosts(topology: Topology, resolve: Resolver = system_resolver) -> Topology:
    """The topology with every DNS name replaced by one endpoint per address it resolves to
    (xDS endpoints must be IP addresses). A name that does not resolve (e.g. a headless Service
    with no ready pod) contributes no endpoint, with a warning."""
    tiers = []
    for tier in topology.tiers:
        clusters = []
        for cluster in tier.clusters:
            endpoints: list[Endpoint] = []
            for endpoint in cluster.endpoints:
                if _is_ip(endpoint.host):
                    endpoints.append(endpoint)
                    continue
                try:
                    addresses = resolve(endpoint.host, endpoint.port)
                except OSError as e:
                    log.warning(
                        "cluster %s: %s does not resolve: %s", cluster.name, endpoint.host, e
                    )
                    addresses = []
                endpoints += [replace(endpoint, host=address) for address in addresses]
            clusters.append(replace(cluster, endpoints=tuple(endpoints)))
        tiers.append(replace(tier, clusters=tuple(clusters)))
    return replace(topology, tiers=tuple(tiers))


class ControlPlane:
    """The cache, the node records and the topology being served. `publish` is all-or-nothing."""

    def __init__(self, resolve: Resolver = system_resolver) -> None:
        self.cache = SnapshotCache(node_group=node_group)
        self.book = NodeStatusBook()
        self.resolve = resolve
        self.topology: Topology | None = None  # as served (names resolved)
        self.source: Topology | None = None  # as given (names unresolved)
        self.topology_path = ""
        self.version = 0
        self.published_at = 0.0
        self.last_error = ""
        self.last_error_at = 0.0

    def publish(self, topology: Topology) -> str:
        """Builds every group's snapshot, checks them all, then publishes them all; returns the
        new version. Raises ConfigError (nothing published) if any is refused."""
        resolved = resolve_hosts(topology, self.resolve)
        version = str(self.version + 1)
        snapshots = {
            flavour: Snapshot.of(version, build_resources(resolved, flavour), label=version)
            for flavour in FLAVOURS
        }
        for flavour, snapshot in snapshots.items():
            try:
                snapshot.check_consistent()
            except InconsistentSnapshot as e:
                raise ConfigError(f"{flavour} snapshot inconsistent: {e}") from None
        for flavour, snapshot in snapshots.items():
            self.cache.set_snapshot(flavour, snapshot)
        self.version += 1
        self.topology, self.source = resolved, topology
        self.published_at = time.time()
        return version

    def reload(self, path: Path) -> bool:
        """Loads `path` and publishes it; on any error records it and keeps what is served."""
        self.topology_path = str(path)
        try:
            version = self.publish(load_topology(path))
        except ConfigError as e:
            self.last_error, self.last_error_at = str(e), time.time()
            log.error("topology refused, still serving version %s: %s", self.version or "-", e)
            return False
        self.last_error = ""
        if self.source is not None:
            save_last_good(self.source, path)
        log.info("topology %s published as version %s", path, version)
        return True

    def load_at_start(self, path: Path) -> None:
        """Publishes `path`, or, if it is invalid, its last good version (recording why); raises
        ConfigError when neither can be served."""
        self.topology_path = str(path)
        loaded = load_or_last_good(path)
        self.publish(loaded.topology)
        if loaded.fallback_reason:
            self.last_error, self.last_error_at = loaded.fallback_reason, time.time()
            log.error("topology refused at start: %s", loaded.fallback_reason)
        elif self.source is not None:
            save_last_good(self.source, path)


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


async def watch_topology(
    plane: ControlPlane, path: Path, interval_s: float = POLL_INTERVAL_S
) -> None:
    """Reloads `path` whenever its mtime or size changes (and re-resolves DNS names every
    RESOLVE_INTERVAL_S); runs until cancelled."""
    seen = _stat(path)
    resolved_at = time.monotonic()
    while True:
        await asyncio.sleep(interval_s)
        current = _stat(path)
        names = plane.source is not None and has_host_names(plane.source)
        due = names and time.monotonic() - resolved_at > RESOLVE_INTERVAL_S
        if current != seen or due:
            seen = current
            resolved_at = time.monotonic()
            if current is not None:
                plane.reload(path)


@dataclass
class RunningControlPlane:
    plane: ControlPlane
    running: RunningServer
    host: str
    watcher: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.running.port}"

    async def stop(self, grace_s: float = 0.0) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
        await self.running.drain(grace_s)


async def start_control_plane(
    topology_path: Path | None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    topology: Topology | None = None,
    poll_interval_s: float = POLL_INTERVAL_S,
    security: ServiceSecurity | None = None,
) -> RunningControlPlane:
    """Serves ADS + admin + health on host:port (0 = any free port). With `topology_path` the
    file is loaded (a bad first file is replaced by its last good version, else raises
    ConfigError) and watched; with `topology` that topology is published as is. Health is
    SERVING once a snapshot is published. `security` (TLS, allowed ADS callers, API keys for the
    admin service) defaults to plaintext."""
    security = security or ServiceSecurity()
    security.check_listen(host, "control plane")
    plane = ControlPlane()
    if topology_path is not None:
        plane.load_at_start(topology_path)
    elif topology is not None:
        plane.publish(topology)

    def register(server: Any) -> None:
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
            AggregatedDiscoveryServicer(plane.cache, plane.book), server
        )
        mesh_pb2_grpc.add_MeshAdminServiceServicer_to_server(MeshAdminServicer(plane), server)

    running = await start_server(
        host,
        port,
        register,
        [ADS_SERVICE, ADMIN_SERVICE],
        control_plane_interceptors(security, ADS_SERVICE, ADMIN_SERVICE),
        security.server_credentials(),
        security.reflection,
    )
    await running.set_serving(True)
    started = RunningControlPlane(plane, running, host)
    if topology_path is not None:
        started.watcher = asyncio.create_task(watch_topology(plane, topology_path, poll_interval_s))
    return started
