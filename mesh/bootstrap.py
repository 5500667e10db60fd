"""Bootstrap files that point a client at the control plane: the gRPC xDS bootstrap (for
proxyless clients such as the router, read from GRPC_XDS_BOOTSTRAP or GRPC_XDS_BOOTSTRAP_CONFIG)
and an Envoy bootstrap (ADS for listeners and clusters, RDS/EDS over ADS).

Plain dictionaries ready for json.dumps; knows nothing of xDS message classes or serving.
"""

from __future__ import annotations

import json
from typing import Any

from mesh.topology import Topology

BOOTSTRAP_CONFIG_ENV = "GRPC_XDS_BOOTSTRAP_CONFIG"
ENVOY_ADMIN_PORT = 9901


def grpc_bootstrap(
    control_plane: str, node_id: str, cluster: str = "tiermesh", zone: str = ""
) -> dict[str, Any]:
    """The gRPC xDS bootstrap: one ADS server (insecure, xDS v3) and this client's node."""
    node: dict[str, Any] = {"id": node_id, "cluster": cluster}
    if zone:
        node["locality"] = {"zone": zone}
    return {
        "xds_servers": [
            {
                "server_uri": control_plane,
                "channel_creds": [{"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": node,
    }


def bootstrap_env(control_plane: str, node_id: str) -> dict[str, str]:
    """The environment that makes every xds:/// channel of a process use this control plane.
    It must be in place before the process creates its first xds channel."""
    return {BOOTSTRAP_CONFIG_ENV: json.dumps(grpc_bootstrap(control_plane, node_id))}


def envoy_bootstrap(
    topology: Topology, node_id: str = "envoy", admin_port: int = ENVOY_ADMIN_PORT
) -> dict[str, Any]:
    """An Envoy v3 bootstrap: a static `xds_cluster` (HTTP/2) to the control plane and every
    listener and cluster from ADS. Envoy names itself "envoy", so the control plane serves it
    the socket listeners (`topology.envoy.base_port` + tier index)."""
    host, _, port = topology.control_plane.rpartition(":")
    return {
        "node": {"id": node_id, "cluster": "tiermesh-envoy"},
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds_cluster"}}],
            },
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {
            "clusters": [
                {
                    "name": "xds_cluster",
                    "type": "STRICT_DNS",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/"
                            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": "xds_cluster",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": host,
                                                    "port_value": int(port),
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ],
                    },
                }
            ]
        },
    }
