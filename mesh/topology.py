"""The mesh topology: which tiers exist, the clusters (model versions) behind each, their
endpoints, and how a tier's traffic is split, timed out and retried.

Plain frozen dataclasses, the defaults that match `tiermesh run`'s ports, and a YAML writer.
Knows nothing of xDS messages (see `mesh.resources`) or of how a file is parsed and checked
(see `mesh.topology_file`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from services.common.tiers import TIER_NAMES

HEALTH_STATES = ("healthy", "unhealthy", "draining", "unknown")
LB_POLICIES = ("round_robin", "ring_hash", "least_request")  # least_request: Envoy only
RETRY_CODES = ("cancelled", "deadline-exceeded", "internal", "resource-exhausted", "unavailable")

DEFAULT_ROUTER_PORT = 50051
DEFAULT_TIER_PORTS = {"small": 50061, "medium": 50062, "large": 50063}
CONTROL_PLANE_OFFSET = 30  # control plane port = router port + 30 (50081 by default)
ENVOY_BASE_PORT = 15061  # Envoy listens for tier i (small, medium, large) on 15061 + i


def listener_name(tier: str) -> str:
    """The xDS Listener name of a tier, equal to the `xds:///` target that reaches it."""
    return f"tier-{tier}"


def xds_target(tier: str) -> str:
    return f"xds:///{listener_name(tier)}"


@dataclass(frozen=True)
class Locality:
    region: str = "local"
    zone: str = ""
    sub_zone: str = ""

    def label(self) -> str:
        return "/".join(part for part in (self.region, self.zone, self.sub_zone) if part)


@dataclass(frozen=True)
class Endpoint:
    """One replica of a cluster: where it listens, where it runs, its share and its health."""

    host: str  # an IP address or a DNS name (names are resolved when a snapshot is built)
    port: int
    locality: Locality = Locality()
    weight: int = 1  # share within its locality (Envoy); the locality weighs the sum (gRPC)
    health: str = "healthy"  # healthy | unhealthy | draining | unknown

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Cluster:
    """One version of a tier's model, e.g. `large-v1`: its replicas and its share of the route."""

    name: str
    endpoints: tuple[Endpoint, ...]
    weight: int = 1  # share of the tier's traffic among the tier's clusters
    lb_policy: str = "round_robin"


def serving_port(tier: str, cluster: Cluster) -> int:
    """The port a cluster's replicas serve on: its first endpoint's, else the tier's default."""
    return cluster.endpoints[0].port if cluster.endpoints else DEFAULT_TIER_PORTS[tier]


@dataclass(frozen=True)
class RetryPolicy:
    """gRPC retries (gRFC A44): only before the first response message is committed."""

    retry_on: tuple[str, ...] = ("unavailable",)
    num_retries: int = 1
    base_interval_ms: int = 25
    max_interval_ms: int = 250


@dataclass(frozen=True)
class Tier:
    """One tier as the mesh routes it: the Listener `tier-<name>` and its clusters."""

    name: str
    clusters: tuple[Cluster, ...]
    timeout_s: float | None = None  # per-call limit (max_stream_duration); None = caller's
    retry: RetryPolicy | None = None

    @property
    def listener(self) -> str:
        return listener_name(self.name)

    @property
    def route_config(self) -> str:
        return f"{self.listener}-route"


@dataclass(frozen=True)
class Resources:
    """Kubernetes requests and limits for one container."""

    cpu: str = "1"
    memory: str = "2Gi"
    gpu: int = 0  # nvidia.com/gpu per pod: tiers whose engine is tensorrt_llm or CUDA torch


@dataclass(frozen=True)
class ModelVolume:
    """Where a vLLM tier's pod finds its model: a PersistentVolumeClaim, mounted read-only, and
    the model folder's path inside it ("" = the volume's root)."""

    claim: str
    sub_path: str = ""


@dataclass(frozen=True)
class Kubernetes:
    namespace: str = "tiermesh"
    image: str = "tiermesh:0.1.0"
    resources: dict[str, Resources] = field(default_factory=dict)  # service name -> resources
    # the image of tiers whose engine is vllm: vLLM and tiermesh's tier server
    vllm_image: str = "tiermesh-vllm:0.1.0"
    # tier name -> its model's volume (vllm tiers); absent = the claim tiermesh-model-<tier>
    models: dict[str, ModelVolume] = field(default_factory=dict)

    def resources_for(self, service: str) -> Resources:
        if service in self.resources:
            return self.resources[service]
        return Resources("500m", "512Mi") if service in ("router", "control-plane") else Resources()


@dataclass(frozen=True)
class Topology:
    tiers: tuple[Tier, ...]
    control_plane: str = f"127.0.0.1:{DEFAULT_ROUTER_PORT + CONTROL_PLANE_OFFSET}"
    router: str = f"127.0.0.1:{DEFAULT_ROUTER_PORT}"
    envoy_listen_address: str = "127.0.0.1"
    envoy_base_port: int = ENVOY_BASE_PORT
    kubernetes: Kubernetes = Kubernetes()

    def tier(self, name: str) -> Tier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(name)

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        return tuple(cluster for tier in self.tiers for cluster in tier.clusters)

    def envoy_port(self, tier: str) -> int:
        return self.envoy_base_port + TIER_NAMES.index(tier)


def local_topology(
    tier_ports: Mapping[str, int | Sequence[int]] | None = None,
    router_port: int = DEFAULT_ROUTER_PORT,
    control_plane_port: int | None = None,
    host: str = "127.0.0.1",
) -> Topology:
    """One cluster `<tier>-v1` per tier with an endpoint per port (one port, or a replica's
    each): the layout `tiermesh run` starts."""
    ports: Mapping[str, int | Sequence[int]] = tier_ports or DEFAULT_TIER_PORTS
    zone = Locality("local", "zone-a")
    tiers = tuple(
        Tier(
            name,
            (
                Cluster(
                    f"{name}-v1",
                    tuple(
                        Endpoint(host, port, zone)
                        for port in ((ports_of,) if isinstance(ports_of, int) else ports_of)
                    ),
                ),
            ),
            retry=RetryPolicy(),
        )
        for name, ports_of in ports.items()
    )
    cp_port = (
        router_port + CONTROL_PLANE_OFFSET if control_plane_port is None else control_plane_port
    )
    return Topology(tiers, control_plane=f"{host}:{cp_port}", router=f"{host}:{router_port}")


def to_plain(topology: Topology) -> dict[str, Any]:
    """The topology as plain data in the file's layout (what `mesh.topology_file` reads)."""
    tiers: dict[str, Any] = {}
    for tier in topology.tiers:
        entry: dict[str, Any] = {}
        if tier.timeout_s is not None:
            entry["timeout_s"] = tier.timeout_s
        if tier.retry is not None:
            entry["retry"] = {
                "retry_on": list(tier.retry.retry_on),
                "num_retries": tier.retry.num_retries,
                "base_interval_ms": tier.retry.base_interval_ms,
                "max_interval_ms": tier.retry.max_interval_ms,
            }
        entry["clusters"] = [_plain_cluster(cluster) for cluster in tier.clusters]
        tiers[tier.name] = entry
    return {
        "control_plane": {"address": topology.control_plane},
        "router": {"address": topology.router},
        "tiers": tiers,
        "envoy": {
            "listen_address": topology.envoy_listen_address,
            "base_port": topology.envoy_base_port,
        },
        "kubernetes": {
            "namespace": topology.kubernetes.namespace,
            "image": topology.kubernetes.image,
            "resources": {
                name: {"cpu": r.cpu, "memory": r.memory, **({"gpu": r.gpu} if r.gpu else {})}
                for name, r in topology.kubernetes.resources.items()
            },
            "vllm_image": topology.kubernetes.vllm_image,
            "models": {
                name: {"claim": m.claim, "sub_path": m.sub_path}
                for name, m in topology.kubernetes.models.items()
            },
        },
    }


def _plain_cluster(cluster: Cluster) -> dict[str, Any]:
    return {
        "name": cluster.name,
        "weight": cluster.weight,
        "lb_policy": cluster.lb_policy,
        "endpoints": [
            {
                "address": endpoint.address,
                "locality": {
                    key: value
                    for key, value in (
                        ("region", endpoint.locality.region),
                        ("zone", endpoint.locality.zone),
                        ("sub_zone", endpoint.locality.sub_zone),
                    )
                    if value
                },
                "weight": endpoint.weight,
                "health": endpoint.health,
            }
            for endpoint in cluster.endpoints
        ],
    }


def dump_yaml(topology: Topology, header: str = "") -> str:
    text = yaml.safe_dump(to_plain(topology), sort_keys=False)
    return (header + text) if header else text
