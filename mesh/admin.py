"""The mesh admin service (tiermesh.v1.MeshAdminService): the control plane's status as one
message, who may read it (the `admin` scope when API keys are on; ADS callers by certificate),
the client that fetches it, and its rendering as text or JSON for `tiermesh mesh status`.

Knows the control plane's records (through `PlaneState`, which `mesh.control_plane.ControlPlane`
satisfies) and the admin proto; knows nothing of ADS streams and never imports the control plane.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import grpc
from google.protobuf import json_format
from tiermesh.v1 import mesh_pb2, mesh_pb2_grpc

from mesh.node_status import NodeStatusBook
from mesh.resources import SHORT_NAMES, TYPE_URLS
from mesh.topology import Topology
from services.security.api_key_auth import ApiKeyAuth
from services.security.api_keys import KeyRing
from services.security.settings import ServiceSecurity
from services.security.tls import AllowedCallers


class PlaneState(Protocol):
    """What the admin service reads of the control plane: the topology served, when and from
    where it was published, the last refused reload, and what each node was sent."""

    topology_path: str
    version: int
    published_at: float
    last_error: str
    last_error_at: float
    topology: Topology | None
    book: NodeStatusBook


def status_message(plane: PlaneState) -> mesh_pb2.MeshStatus:
    status = mesh_pb2.MeshStatus(
        topology_path=plane.topology_path,
        topology_version=str(plane.version) if plane.version else "",
        published_unix_s=plane.published_at,
        last_reload_error=plane.last_error,
        last_reload_error_unix_s=plane.last_error_at if plane.last_error else 0.0,
    )
    if plane.topology is not None:
        for tier in plane.topology.tiers:
            for cluster in tier.clusters:
                status.clusters.append(
                    mesh_pb2.ClusterStatus(
                        tier=tier.name,
                        listener=tier.listener,
                        cluster=cluster.name,
                        weight=cluster.weight,
                        endpoints=[
                            mesh_pb2.EndpointStatus(
                                address=e.address,
                                locality=e.locality.label(),
                                weight=e.weight,
                                health=e.health,
                            )
                            for e in cluster.endpoints
                        ],
                    )
                )
    for node in plane.book.nodes():
        entry = status.nodes.add(
            node_id=node.node_id,
            group=node.group,
            user_agent=node.user_agent,
            streams=node.streams,
            last_seen_unix_s=node.last_seen,
        )
        for type_url in TYPE_URLS:
            record = node.types.get(type_url)
            if record is None:
                continue
            last_nack = record.last_nack
            entry.types.add(
                type=SHORT_NAMES[type_url],
                type_url=type_url,
                resource_names=record.resource_names,
                state=record.state,
                sent_version=record.sent_version,
                acked_version=record.acked_version,
                nacked_version=last_nack.nacked_version if last_nack else "",
                nack_detail=last_nack.nack_detail if last_nack else "",
                nacked_unix_s=last_nack.nacked_at if last_nack else 0.0,
                resources=[
                    mesh_pb2.ResourceStatus(
                        name=r.name,
                        state=r.state,
                        sent_version=r.sent_version,
                        acked_version=r.acked_version,
                        nacked_version=r.nacked_version,
                        nack_detail=r.nack_detail,
                    )
                    for r in record.resources.values()
                ],
            )
    return status


class MeshAdminServicer(mesh_pb2_grpc.MeshAdminServiceServicer):
    def __init__(self, plane: PlaneState) -> None:
        self.plane = plane

    async def GetMeshStatus(
        self, request: mesh_pb2.GetMeshStatusRequest, context: grpc.aio.ServicerContext
    ) -> mesh_pb2.MeshStatus:
        return status_message(self.plane)


def control_plane_interceptors(
    security: ServiceSecurity, ads_service: str, admin_service: str
) -> list[Any]:
    """Who may call what on the control plane: with allowed callers, ADS (and reflection) only
    from those certificates; with a key file, the admin service only with a key holding the
    `admin` scope. Each check leaves the other's service to it: the admin service takes keys,
    not client certificates (an operator's `tiermesh mesh status` has none), and ADS clients
    (gRPC's xDS client) send no key."""
    chain: list[Any] = []
    if security.allowed_callers:
        chain.append(AllowedCallers(security.allowed_callers, (f"/{admin_service}/",)))
    if security.keys_file is not None:
        ring = KeyRing(security.keys_file)
        chain.append(ApiKeyAuth(ring, {}, open_prefixes=(f"/{ads_service}/",)))
    return chain


def fetch_status(
    address: str,
    timeout_s: float = 5.0,
    credentials: grpc.ChannelCredentials | None = None,
    api_key: str | None = None,
) -> mesh_pb2.MeshStatus:
    """Asks the control plane at `address` (over TLS with `credentials`, with `api_key` as a
    bearer token); raises grpc.RpcError if it does not answer or refuses."""
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials)
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
    with channel:
        stub = mesh_pb2_grpc.MeshAdminServiceStub(channel)
        response: mesh_pb2.MeshStatus = stub.GetMeshStatus(
            mesh_pb2.GetMeshStatusRequest(), timeout=timeout_s, metadata=metadata
        )
        return response


def status_json(status: mesh_pb2.MeshStatus) -> str:
    data: dict[str, Any] = json_format.MessageToDict(
        status, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(data, indent=2)


def _ago(unix_s: float) -> str:
    return f"{max(0.0, time.time() - unix_s):.1f} s ago" if unix_s else "-"


def status_text(status: mesh_pb2.MeshStatus) -> str:
    lines = [
        f"topology {status.topology_path or '(given in code)'}: version "
        f"{status.topology_version or '-'}, published {_ago(status.published_unix_s)}"
    ]
    if status.last_reload_error:
        lines.append(
            f"last reload REFUSED ({_ago(status.last_reload_error_unix_s)}): "
            f"{status.last_reload_error}"
        )
    lines.append("")
    lines.append("endpoints per tier:")
    for cluster in status.clusters:
        lines.append(
            f"  {cluster.tier:<7} {cluster.listener:<12} cluster {cluster.cluster} "
            f"(weight {cluster.weight})"
        )
        for e in cluster.endpoints:
            lines.append(
                f"      {e.address:<22} {e.health:<9} weight {e.weight:<4} locality {e.locality}"
            )
        if not cluster.endpoints:
            lines.append("      (no endpoints)")
    lines.append("")
    lines.append(f"nodes ({len(status.nodes)}):")
    for node in status.nodes:
        connected = f"{node.streams} stream(s)" if node.streams else "disconnected"
        lines.append(
            f"  {node.node_id} [{node.group}] {node.user_agent}: {connected}, "
            f"last seen {_ago(node.last_seen_unix_s)}"
        )
        for t in node.types:
            line = (
                f"      {t.type} {t.state:<7} sent v{t.sent_version or '-'} "
                f"acked v{t.acked_version or '-'}: {', '.join(t.resource_names) or '(none)'}"
            )
            lines.append(line)
            for r in t.resources:
                if r.state == "NACKED":
                    lines.append(f"          {r.name} NACKed v{r.nacked_version}: {r.nack_detail}")
    return "\n".join(lines)
