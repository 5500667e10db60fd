"""Bootstrap files that point a client at the control plane: the gRPC xDS bootstrap (for
proxyless clients such as the router, read from GRPC_XDS_BOOTSTRAP or GRPC_XDS_BOOTSTRAP_CONFIG)
and an Envoy bootstrap (ADS for listeners and clusters, RDS/EDS over ADS).

Plain dictionaries ready for json.dumps; knows nothing of xDS message classes or serving.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mesh.topology import Topology

BOOTSTRAP_CONFIG_ENV = "GRPC_XDS_BOOTSTRAP_CONFIG"
ENVOY_ADMIN_PORT = 9901


# The channel credential types gRPC's xDS clients know (the bootstrap design, gRFC A27, A29
# and A65).
CHANNEL_CREDS = ("insecure", "google_default", "tls", "xds")
TLS_REFRESH_INTERVAL = "60s"  # how often the xDS client re-reads its certificate files


@dataclass(frozen=True)
class XdsTls:
    """The files of the ADS stream's TLS (gRFC A65 `tls` channel credentials): the CA that
    signs the control plane's certificate, and this client's certificate and key (mTLS) or
    neither (TLS)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def channel_creds(self) -> dict[str, Any]:
        """The bootstrap's channel_creds entry; paths are made absolute (the client reads them
        from wherever its process runs, and again every TLS_REFRESH_INTERVAL)."""
        config: dict[str, Any] = {
            "ca_certificate_file": str(self.ca.resolve()),
            "refresh_interval": TLS_REFRESH_INTERVAL,
        }
        if self.cert is not None and self.key is not None:
            config["certificate_file"] = str(self.cert.resolve())
            config["private_key_file"] = str(self.key.resolve())
        return {"type": "tls", "config": config}


def grpc_bootstrap(
    control_plane: str,
    node_id: str,
    cluster: str = "tiermesh",
    zone: str = "",
    region: str = "",
    sub_zone: str = "",
    tls: XdsTls | None = None,
) -> dict[str, Any]:
    """The gRPC xDS bootstrap: one ADS server (xDS v3; plaintext, or TLS with `tls`) and this
    client's node.

    Every field the gRPC xDS bootstrap design lists for the node is written, `locality` too
    (empty strings when unknown): grpcio accepts a node without it, some other languages'
    clients refuse one."""
    node: dict[str, Any] = {
        "id": node_id,
        "cluster": cluster,
        "locality": {"region": region, "zone": zone, "sub_zone": sub_zone},
        "metadata": {},
    }
    return {
        "xds_servers": [
            {
                "server_uri": control_plane,
                "channel_creds": [tls.channel_creds() if tls else {"type": "insecure"}],
                "server_features": ["xds_v3"],
            }
        ],
        "node": node,
    }


def bootstrap_env(control_plane: str, node_id: str, tls: XdsTls | None = None) -> dict[str, str]:
    """The environment that makes every xds:/// channel of a process use this control plane.
    It must be in place before the process creates its first xds channel."""
    return {BOOTSTRAP_CONFIG_ENV: json.dumps(grpc_bootstrap(control_plane, node_id, tls=tls))}


def _tls_config_problems(where: str, config: Any) -> list[str]:
    """What a `tls` channel_creds config (gRFC A65) gets wrong."""
    if not isinstance(config, dict):
        return [f"{where}.config: must be an object (ca_certificate_file, ...)"]
    problems = [
        f"{where}.config.{name}: must be a string (a file path)"
        for name in ("ca_certificate_file", "certificate_file", "private_key_file")
        if name in config and not isinstance(config[name], str)
    ]
    if ("certificate_file" in config) != ("private_key_file" in config):
        problems.append(f"{where}.config: certificate_file and private_key_file go together")
    return problems


def bootstrap_problems(bootstrap: Any) -> list[str]:
    """What a gRPC xDS bootstrap lacks or gets wrong, one sentence each; empty when it is one
    that gRPC's xDS clients in every language accept."""
    if not isinstance(bootstrap, dict):
        return ["the bootstrap must be a JSON object"]
    problems: list[str] = []
    servers = bootstrap.get("xds_servers")
    if not isinstance(servers, list) or not servers:
        problems.append("xds_servers: must be a non-empty list of control plane servers")
        servers = []
    for i, server in enumerate(servers):
        where = f"xds_servers[{i}]"
        if not isinstance(server, dict):
            problems.append(f"{where}: must be an object")
            continue
        uri = server.get("server_uri")
        if not isinstance(uri, str) or not uri:
            problems.append(f"{where}.server_uri: must be a non-empty string (host:port)")
        creds = server.get("channel_creds")
        if not isinstance(creds, list) or not creds:
            problems.append(f"{where}.channel_creds: must be a non-empty list")
        elif not any(isinstance(c, dict) and c.get("type") in CHANNEL_CREDS for c in creds):
            problems.append(
                f"{where}.channel_creds: no entry with a type clients know "
                f"({', '.join(CHANNEL_CREDS)})"
            )
        else:
            for j, cred in enumerate(creds):
                if isinstance(cred, dict) and cred.get("type") == "tls":
                    problems += _tls_config_problems(
                        f"{where}.channel_creds[{j}]", cred.get("config", {})
                    )
        features = server.get("server_features", [])
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            problems.append(f"{where}.server_features: must be a list of strings")
        elif "xds_v3" not in features:
            problems.append(
                f'{where}.server_features: lacks "xds_v3" (the control plane speaks v3)'
            )
    node = bootstrap.get("node")
    if not isinstance(node, dict):
        problems.append("node: must be an object with id, cluster and locality")
        return problems
    if not isinstance(node.get("id"), str) or not node["id"]:
        problems.append("node.id: must be a non-empty string")
    if "cluster" in node and not isinstance(node["cluster"], str):
        problems.append("node.cluster: must be a string")
    locality = node.get("locality")
    if not isinstance(locality, dict):
        problems.append(
            "node.locality: missing (some xDS clients refuse a node without it; "
            '{"region": "", "zone": "", "sub_zone": ""} will do)'
        )
    else:
        for key in ("region", "zone", "sub_zone"):
            if not isinstance(locality.get(key, ""), str):
                problems.append(f"node.locality.{key}: must be a string")
    if "metadata" in node and not isinstance(node["metadata"], dict):
        problems.append("node.metadata: must be an object")
    return problems


def envoy_bootstrap(
    topology: Topology,
    node_id: str = "envoy",
    admin_port: int = ENVOY_ADMIN_PORT,
    tls: XdsTls | None = None,
) -> dict[str, Any]:
    """An Envoy v3 bootstrap: a static `xds_cluster` (HTTP/2) to the control plane and every
    listener and cluster from ADS. Envoy names itself "envoy", so the control plane serves it
    the socket listeners (`topology.envoy.base_port` + tier index). With `tls` the ADS stream
    is TLS (mTLS with a certificate) and Envoy checks the control plane's certificate."""
    host, _, port = topology.control_plane.rpartition(":")
    cluster = _envoy_xds_cluster(host, int(port))
    if tls is not None:
        cluster["transport_socket"] = _envoy_upstream_tls(tls, host)
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
        "static_resources": {"clusters": [cluster]},
    }


def _envoy_xds_cluster(host: str, port: int) -> dict[str, Any]:
    """The static cluster that reaches the control plane over HTTP/2."""
    endpoint = {"address": {"socket_address": {"address": host, "port_value": port}}}
    return {
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
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
    }


def _envoy_upstream_tls(tls: XdsTls, host: str) -> dict[str, Any]:
    """Envoy's TLS to the control plane: the CA that must have signed the control plane's
    certificate, whose names must include `host` (sent as SNI), and Envoy's own certificate
    when it has one (the control plane serves ADS only to the identities it allows)."""
    context: dict[str, Any] = {
        "validation_context": {
            "trusted_ca": {"filename": str(tls.ca.resolve())},
            "match_typed_subject_alt_names": [
                {"san_type": "DNS", "matcher": {"exact": host}},
                {"san_type": "IP_ADDRESS", "matcher": {"exact": host}},
            ],
        }
    }
    if tls.cert is not None and tls.key is not None:
        context["tls_certificates"] = [
            {
                "certificate_chain": {"filename": str(tls.cert.resolve())},
                "private_key": {"filename": str(tls.key.resolve())},
            }
        ]
    upstream: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": context,
    }
    if not _is_ip(host):  # SNI carries host names only
        upstream["sni"] = host
    return {"name": "envoy.transport_sockets.tls", "typed_config": upstream}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
