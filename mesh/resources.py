"""Builds the four xDS resource types from a topology: Listener, RouteConfiguration, Cluster,
ClusterLoadAssignment. The one place that knows how a topology becomes envoy.config.* messages.

Two flavours: `proxyless` (gRPC clients: a Listener per tier with an api_listener, named like the
`xds:///` target) and `envoy` (a socket Listener per tier, HTTP/2 upstreams). Both use RDS and
EDS over ADS. Knows nothing of versions, nodes or streams (see `mesh.snapshot`, `mesh.ads`).
Endpoint hosts must already be IP addresses (see `mesh.control_plane.resolve_hosts`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2  # type: ignore[import-untyped]
from envoy.config.core.v3 import (  # type: ignore[import-untyped]
    address_pb2,
    base_pb2,
    config_source_pb2,
    health_check_pb2,
    protocol_pb2,
)
from envoy.config.endpoint.v3 import (  # type: ignore[import-untyped]
    endpoint_components_pb2,
    endpoint_pb2,
)
from envoy.config.listener.v3 import (  # type: ignore[import-untyped]
    api_listener_pb2,
    listener_components_pb2,
    listener_pb2,
)
from envoy.config.route.v3 import (  # type: ignore[import-untyped]
    route_components_pb2,
    route_pb2,
)
from envoy.extensions.filters.http.router.v3 import router_pb2  # type: ignore[import-untyped]
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # type: ignore[import-untyped]
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.upstreams.http.v3 import (  # type: ignore[import-untyped]
    http_protocol_options_pb2,
)
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from mesh.topology import Cluster, RetryPolicy, Tier, Topology

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINT = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
TYPE_URLS = (LISTENER, ROUTE, CLUSTER, ENDPOINT)  # the order a client subscribes in
SHORT_NAMES = {LISTENER: "LDS", ROUTE: "RDS", CLUSTER: "CDS", ENDPOINT: "EDS"}

PROXYLESS = "proxyless"
ENVOY = "envoy"
FLAVOURS = (PROXYLESS, ENVOY)

ROUTER_FILTER = "envoy.filters.http.router"
HCM_FILTER = "envoy.filters.network.http_connection_manager"
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
LB_POLICIES = {
    "round_robin": cluster_pb2.Cluster.ROUND_ROBIN,
    "ring_hash": cluster_pb2.Cluster.RING_HASH,
    "least_request": cluster_pb2.Cluster.LEAST_REQUEST,
}
HEALTH = {
    "healthy": health_check_pb2.HEALTHY,
    "unhealthy": health_check_pb2.UNHEALTHY,
    "draining": health_check_pb2.DRAINING,
    "unknown": health_check_pb2.UNKNOWN,
}


def build_resources(topology: Topology, flavour: str = PROXYLESS) -> dict[str, dict[str, Message]]:
    """Every resource of the topology, by type URL and name."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour: {flavour!r} is not one of {', '.join(FLAVOURS)}")
    resources: dict[str, dict[str, Message]] = {type_url: {} for type_url in TYPE_URLS}
    for tier in topology.tiers:
        if flavour == PROXYLESS:
            resources[LISTENER][tier.listener] = api_listener(tier)
        else:
            port = topology.envoy_port(tier.name)
            resources[LISTENER][tier.listener] = socket_listener(
                tier, topology.envoy_listen_address, port
            )
        resources[ROUTE][tier.route_config] = route_configuration(tier)
        for cluster in tier.clusters:
            resources[CLUSTER][cluster.name] = eds_cluster(cluster, http2=flavour == ENVOY)
            resources[ENDPOINT][cluster.name] = load_assignment(cluster)
    return resources


def _ads() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def http_connection_manager(tier: Tier) -> hcm_pb2.HttpConnectionManager:
    """RDS over ADS and the router filter, last (gRPC NACKs a chain without it at the end)."""
    return hcm_pb2.HttpConnectionManager(
        stat_prefix=tier.listener,
        codec_type=hcm_pb2.HttpConnectionManager.AUTO,
        rds=hcm_pb2.Rds(config_source=_ads(), route_config_name=tier.route_config),
        http_filters=[
            hcm_pb2.HttpFilter(name=ROUTER_FILTER, typed_config=_pack(router_pb2.Router()))
        ],
    )


def api_listener(tier: Tier) -> listener_pb2.Listener:
    """The Listener a proxyless gRPC client resolves `xds:///tier-<name>` to."""
    return listener_pb2.Listener(
        name=tier.listener,
        api_listener=api_listener_pb2.ApiListener(
            api_listener=_pack(http_connection_manager(tier))
        ),
    )


def socket_listener(tier: Tier, host: str, port: int) -> listener_pb2.Listener:
    """The Listener an Envoy sidecar or gateway serves the tier on."""
    return listener_pb2.Listener(
        name=tier.listener,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address=host, port_value=port)
        ),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name=HCM_FILTER, typed_config=_pack(http_connection_manager(tier))
                    )
                ]
            )
        ],
    )


def route_configuration(tier: Tier) -> route_pb2.RouteConfiguration:
    """One catch-all route (prefix "" set explicitly) to the tier's cluster or weighted clusters."""
    action = route_components_pb2.RouteAction()
    if len(tier.clusters) == 1:
        action.cluster = tier.clusters[0].name
    else:
        action.weighted_clusters.CopyFrom(
            route_components_pb2.WeightedCluster(
                clusters=[
                    route_components_pb2.WeightedCluster.ClusterWeight(
                        name=cluster.name, weight=wrappers_pb2.UInt32Value(value=cluster.weight)
                    )
                    for cluster in tier.clusters
                ]
            )
        )
    if tier.timeout_s is not None:
        limit = _duration(tier.timeout_s)
        action.timeout.CopyFrom(limit)  # Envoy
        action.max_stream_duration.max_stream_duration.CopyFrom(limit)  # gRPC and Envoy
    else:
        action.timeout.CopyFrom(duration_pb2.Duration(seconds=0))  # no limit: tokens stream
    if tier.retry is not None:
        action.retry_policy.CopyFrom(_retry_policy(tier.retry))
    return route_pb2.RouteConfiguration(
        name=tier.route_config,
        virtual_hosts=[
            route_components_pb2.VirtualHost(
                name=tier.listener,
                domains=["*"],
                routes=[
                    route_components_pb2.Route(
                        match=route_components_pb2.RouteMatch(prefix=""), route=action
                    )
                ],
            )
        ],
    )


def _retry_policy(policy: RetryPolicy) -> route_components_pb2.RetryPolicy:
    return route_components_pb2.RetryPolicy(
        retry_on=",".join(policy.retry_on),
        num_retries=wrappers_pb2.UInt32Value(value=policy.num_retries),
        retry_back_off=route_components_pb2.RetryPolicy.RetryBackOff(
            base_interval=_duration(policy.base_interval_ms / 1000),
            max_interval=_duration(policy.max_interval_ms / 1000),
        ),
    )


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def eds_cluster(cluster: Cluster, http2: bool = False) -> cluster_pb2.Cluster:
    """An EDS cluster over ADS (gRPC NACKs STATIC ones); `http2` for Envoy's upstream gRPC."""
    message = cluster_pb2.Cluster(
        name=cluster.name,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(
            eds_config=_ads(), service_name=cluster.name
        ),
        lb_policy=LB_POLICIES[cluster.lb_policy],
        connect_timeout=_duration(1.0),
    )
    if http2:
        options = http_protocol_options_pb2.HttpProtocolOptions(
            explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
                http2_protocol_options=protocol_pb2.Http2ProtocolOptions()
            )
        )
        message.typed_extension_protocol_options[HTTP_OPTIONS].CopyFrom(_pack(options))
    return message


def load_assignment(cluster: Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    """Endpoints grouped by locality. Every locality carries a weight (the sum of its
    endpoints'): without one gRPC drops the locality silently."""
    by_locality: dict[tuple[str, str, str], list[endpoint_components_pb2.LbEndpoint]] = {}
    weights: dict[tuple[str, str, str], int] = {}
    for endpoint in cluster.endpoints:
        key = (endpoint.locality.region, endpoint.locality.zone, endpoint.locality.sub_zone)
        by_locality.setdefault(key, []).append(
            endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(
                    address=address_pb2.Address(
                        socket_address=address_pb2.SocketAddress(
                            address=endpoint.host, port_value=endpoint.port
                        )
                    )
                ),
                health_status=HEALTH[endpoint.health],
                load_balancing_weight=wrappers_pb2.UInt32Value(value=endpoint.weight),
            )
        )
        weights[key] = weights.get(key, 0) + endpoint.weight
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster.name,
        endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(
                locality=base_pb2.Locality(region=key[0], zone=key[1], sub_zone=key[2]),
                load_balancing_weight=wrappers_pb2.UInt32Value(value=weights[key]),
                lb_endpoints=lb_endpoints,
            )
            for key, lb_endpoints in by_locality.items()
        ],
    )


def references(type_url: str, resource: Any) -> Iterable[str]:
    """The names of the resources `resource` points at (its routes, clusters or endpoints)."""
    if type_url == LISTENER:
        hcm = hcm_pb2.HttpConnectionManager()
        packed = (
            resource.api_listener.api_listener
            if resource.HasField("api_listener")
            else resource.filter_chains[0].filters[0].typed_config
        )
        packed.Unpack(hcm)
        yield hcm.rds.route_config_name
    elif type_url == ROUTE:
        for host in resource.virtual_hosts:
            for route in host.routes:
                if route.route.cluster:
                    yield route.route.cluster
                for weighted in route.route.weighted_clusters.clusters:
                    yield weighted.name
    elif type_url == CLUSTER:
        yield resource.eds_cluster_config.service_name or resource.name


REFERENCED_TYPE = {LISTENER: ROUTE, ROUTE: CLUSTER, CLUSTER: ENDPOINT}
