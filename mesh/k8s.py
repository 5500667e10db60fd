"""Kubernetes manifests for the whole mesh from one topology: per tier cluster (model version) a
Deployment and a headless Service, per tier a ClusterIP Service, the router and the control plane
(with the topology in a ConfigMap), all with native `grpc:` probes, requests and limits, a
non-root read-only securityContext and a Service port named `grpc`; and the HTTP gateway
(OpenAI API and chat page) with `httpGet /health` probes and a Service port named `http`.

In the cluster the topology's endpoints become the headless Services' DNS names, which the control
plane resolves to pod IPs. Plain dictionaries; knows nothing of xDS messages or serving.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import yaml

from mesh.bootstrap import BOOTSTRAP_CONFIG_ENV, grpc_bootstrap
from mesh.topology import Cluster, Endpoint, Resources, Topology, dump_yaml, xds_target

APP = "tiermesh"
TOPOLOGY_MOUNT = "/etc/tiermesh"
RUN_AS_USER = 10001
GATEWAY_PORT = 8080
GATEWAY_RESOURCES = Resources("500m", "256Mi")


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _labels(component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component, **extra}


def _service_host(name: str, namespace: str) -> str:
    return f"{name}.{namespace}.svc.cluster.local"


def cluster_topology(topology: Topology) -> Topology:
    """The topology as the in-cluster control plane sees it: each cluster one endpoint, its
    headless Service's DNS name (the control plane resolves it to every ready pod)."""
    namespace = topology.kubernetes.namespace
    tiers = []
    for tier in topology.tiers:
        clusters = []
        for cluster in tier.clusters:
            port = cluster.endpoints[0].port if cluster.endpoints else 50061
            locality = (
                cluster.endpoints[0].locality if cluster.endpoints else Endpoint("", 0).locality
            )
            host = _service_host(f"tier-{cluster.name}", namespace)
            clusters.append(replace(cluster, endpoints=(Endpoint(host, port, locality),)))
        tiers.append(replace(tier, clusters=tuple(clusters)))
    control_port = _port(topology.control_plane)
    return replace(
        topology,
        tiers=tuple(tiers),
        control_plane=f"{_service_host('tiermesh-control-plane', namespace)}:{control_port}",
    )


def _container(
    name: str, command: list[str], port: int, topology: Topology, service: str
) -> dict[str, Any]:
    resources = topology.kubernetes.resources_for(service)
    probe = {"grpc": {"port": port}, "periodSeconds": 5}
    return {
        "name": name,
        "image": topology.kubernetes.image,
        "command": command,
        "ports": [{"name": "grpc", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {**probe, "initialDelaySeconds": 2},
        "livenessProbe": {**probe, "initialDelaySeconds": 30, "failureThreshold": 6},
        "resources": {
            "requests": {"cpu": resources.cpu, "memory": resources.memory},
            "limits": {"cpu": resources.cpu, "memory": resources.memory},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _deployment(
    name: str, labels: dict[str, str], replicas: int, container: dict[str, Any], **pod: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": RUN_AS_USER,
                        "fsGroup": RUN_AS_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationGracePeriodSeconds": 15,
                    "containers": [container],
                    **pod,
                },
            },
        },
    }


def _service(
    name: str, selector: dict[str, str], port: int, headless: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": selector,
        "ports": [{"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = False
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": selector},
        "spec": spec,
    }


def _tier_objects(tier_name: str, cluster: Cluster, topology: Topology) -> list[dict[str, Any]]:
    port = cluster.endpoints[0].port if cluster.endpoints else 50061
    labels = _labels("tier", **{"tiermesh/tier": tier_name, "tiermesh/cluster": cluster.name})
    command = [
        "python",
        "-m",
        f"services.tier_{tier_name}",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    container = _container(tier_name, command, port, topology, tier_name)
    name = f"tier-{cluster.name}"
    return [
        _deployment(name, labels, max(1, len(cluster.endpoints)), container),
        _service(name, labels, port, headless=True),
    ]


def manifests(topology: Topology) -> list[dict[str, Any]]:
    """Every object, in apply order."""
    namespace = topology.kubernetes.namespace
    in_cluster = cluster_topology(topology)
    control_port = _port(topology.control_plane)
    router_port = _port(topology.router)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "tiermesh-topology", "labels": _labels("control-plane")},
            "data": {"topology.yaml": dump_yaml(in_cluster)},
        },
    ]
    for tier in topology.tiers:
        for cluster in tier.clusters:
            objects += _tier_objects(tier.name, cluster, topology)
        port = tier.clusters[0].endpoints[0].port if tier.clusters[0].endpoints else 50061
        objects.append(
            _service(f"tier-{tier.name}", _labels("tier", **{"tiermesh/tier": tier.name}), port)
        )

    control_labels = _labels("control-plane")
    control_command = [
        "python", "-m", "mesh", "serve", "--topology", f"{TOPOLOGY_MOUNT}/topology.yaml",
        "--host", "0.0.0.0", "--port", str(control_port),
    ]  # fmt: skip
    control = _container("control-plane", control_command, control_port, topology, "control-plane")
    control["volumeMounts"] = [{"name": "topology", "mountPath": TOPOLOGY_MOUNT, "readOnly": True}]
    volumes = [{"name": "topology", "configMap": {"name": "tiermesh-topology"}}]
    objects.append(
        _deployment("tiermesh-control-plane", control_labels, 1, control, volumes=volumes)
    )
    objects.append(_service("tiermesh-control-plane", control_labels, control_port))

    router_labels = _labels("router")
    tiers = [
        arg for tier in topology.tiers for arg in ("--tier", f"{tier.name}={xds_target(tier.name)}")
    ]
    router_command = [
        "python",
        "-m",
        "services.router",
        "--host",
        "0.0.0.0",
        "--port",
        str(router_port),
        *tiers,
    ]
    router = _container("router", router_command, router_port, topology, "router")
    bootstrap = grpc_bootstrap(in_cluster.control_plane, "$(POD_NAME)")
    router["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": BOOTSTRAP_CONFIG_ENV, "value": json.dumps(bootstrap)},
    ]
    objects.append(_deployment("tiermesh-router", router_labels, 1, router))
    objects.append(_service("tiermesh-router", router_labels, router_port))
    objects += _gateway_objects(topology, _service_host("tiermesh-router", namespace), router_port)
    for item in objects[1:]:
        item["metadata"]["namespace"] = namespace
    return objects


def _gateway_objects(
    topology: Topology, router_host: str, router_port: int
) -> list[dict[str, Any]]:
    """The HTTP gateway's Deployment and Service: an HTTP port and `/health` probes (ready once
    the router answers), calling the router's Service over gRPC."""
    labels = _labels("gateway")
    command = [
        "python", "-m", "services.gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT),
        "--router", f"{router_host}:{router_port}",
    ]  # fmt: skip
    container = _container("gateway", command, GATEWAY_PORT, topology, "gateway")
    container["ports"] = [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}]
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}
    container["readinessProbe"] = {**probe, "initialDelaySeconds": 2}
    container["livenessProbe"] = {
        "tcpSocket": {"port": "http"},
        "periodSeconds": 5,
        "initialDelaySeconds": 10,
        "failureThreshold": 6,
    }
    if "gateway" not in topology.kubernetes.resources:
        limits = {"cpu": GATEWAY_RESOURCES.cpu, "memory": GATEWAY_RESOURCES.memory}
        container["resources"] = {"requests": limits, "limits": dict(limits)}
    service = _service("tiermesh-gateway", labels, GATEWAY_PORT)
    service["spec"]["ports"] = [
        {"name": "http", "port": GATEWAY_PORT, "targetPort": "http", "protocol": "TCP"}
    ]
    return [_deployment("tiermesh-gateway", labels, 1, container), service]


def manifests_yaml(topology: Topology) -> str:
    return yaml.safe_dump_all(manifests(topology), sort_keys=False)
