"""Kubernetes manifests for the whole mesh from one topology: per tier cluster (model version) a
Deployment and a headless Service, per tier a ClusterIP Service, the router and the control plane
(with the topology in a ConfigMap), each built from the hardened container, Deployment and Service
of k8s_objects.py (grpc probes, requests and limits, non-root, a `metrics` port); per tier
Deployment a PodDisruptionBudget and a HorizontalPodAutoscaler (k8s_policies.py); tiers given a
config on vLLM (their own image, GPUs, /dev/shm, the model's volume) or on a remote server (no
pod: an adapter in the router's pod), k8s_engines.py; and the HTTP gateway (OpenAI API and chat
page) with `httpGet /health` probes and a Service port named `http`; NetworkPolicies that let
only the router reach the tiers and the control plane.

Plaintext by default: services bind 0.0.0.0 without TLS, so they are started with `--insecure`
(said out loud). With `secure=True` (`tiermesh mesh k8s --secure`) every service speaks TLS with
certificates from Secrets (mesh/k8s_tls.py), and the manifests say which Secrets to create.

In the cluster the topology's endpoints become the headless Services' DNS names, which the control
plane resolves to pod IPs. Plain dictionaries; knows nothing of xDS messages or serving.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from mesh.bootstrap import BOOTSTRAP_CONFIG_ENV, grpc_bootstrap
from mesh.k8s_engines import (
    VLLM_TMP_SIZE,
    TierEngine,
    remote_ports,
    remote_tier,
    secure_adapter,
    tier_engines,
    vllm_tier,
)
from mesh.k8s_objects import (
    APP,
    METRICS_PORT,
    PROBE_PERIOD_S,
    STARTUP_BUDGET_S,
    container_for,
    deployment_for,
    metadata_labels,
    selector_labels,
    service_for,
    service_host,
)
from mesh.k8s_policies import autoscaler, disruption_budget, network_policies
from mesh.k8s_policies import service_monitor as service_monitor_object
from mesh.k8s_tls import mounted_tls, secret_commands, secure_container
from mesh.topology import (
    Cluster,
    Endpoint,
    Resources,
    Topology,
    dump_yaml,
    serving_port,
    xds_target,
)

TOPOLOGY_MOUNT = "/etc/tiermesh"
GATEWAY_PORT = 8080
GATEWAY_RESOURCES = Resources("500m", "256Mi")


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def cluster_topology(topology: Topology) -> Topology:
    """The topology as the in-cluster control plane sees it: each cluster one endpoint, its
    headless Service's DNS name (the control plane resolves it to every ready pod)."""
    namespace = topology.kubernetes.namespace
    tiers = []
    for tier in topology.tiers:
        clusters = []
        for cluster in tier.clusters:
            port = serving_port(tier.name, cluster)
            locality = (
                cluster.endpoints[0].locality if cluster.endpoints else Endpoint("", 0).locality
            )
            host = service_host(f"tier-{cluster.name}", namespace)
            clusters.append(replace(cluster, endpoints=(Endpoint(host, port, locality),)))
        tiers.append(replace(tier, clusters=tuple(clusters)))
    control_port = _port(topology.control_plane)
    return replace(
        topology,
        tiers=tuple(tiers),
        control_plane=f"{service_host('tiermesh-control-plane', namespace)}:{control_port}",
    )


def _tier_objects(
    tier_name: str,
    cluster: Cluster,
    topology: Topology,
    secure: bool,
    engine: TierEngine | None = None,
) -> list[dict[str, Any]]:
    port = serving_port(tier_name, cluster)
    labels = selector_labels(
        "tier", **{"tiermesh/tier": tier_name, "tiermesh/cluster": cluster.name}
    )
    command = [
        "python",
        "-m",
        f"services.tier_{tier_name}",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--metrics-port",
        str(METRICS_PORT),
        *_plaintext_flag(secure),
    ]
    container = container_for(tier_name, command, port, topology, tier_name)
    extra: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    if engine is not None:  # on vLLM (a remote tier has no pod)
        volumes, config_map = vllm_tier(
            engine, topology, container, PROBE_PERIOD_S, metadata_labels(labels)
        )
        extra.append(config_map)
    if secure:
        volumes += secure_container(container, f"tier/{tier_name}", "tier")
    name = f"tier-{cluster.name}"
    replicas = max(1, len(cluster.endpoints))
    deployment = deployment_for(name, labels, replicas, container, volumes=volumes)
    if engine is not None:
        for volume in deployment["spec"]["template"]["spec"]["volumes"]:
            if volume["name"] == "tmp":
                volume["emptyDir"]["sizeLimit"] = VLLM_TMP_SIZE
    return [
        *extra,
        deployment,
        service_for(name, labels, port, headless=True),
        disruption_budget(name, labels, metadata_labels(labels)),
        autoscaler(name, replicas, metadata_labels(labels)),
    ]


def _plaintext_flag(secure: bool) -> list[str]:
    """`--insecure` for a plaintext service on 0.0.0.0 (it refuses to start without it)."""
    return [] if secure else ["--insecure"]


def manifests(
    topology: Topology,
    service_monitor: bool = False,
    secure: bool = False,
    cors_origins: tuple[str, ...] = (),
    tier_configs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every object, in apply order; with `service_monitor`, a Prometheus Operator
    ServiceMonitor too; with `secure`, TLS everywhere from Secrets the cluster must hold;
    `cors_origins`: the browser origins the gateway serves cross-origin (none: same origin);
    `tier_configs`: tier name -> the fields of its config (TOML) for a tier on vllm or openai
    (k8s_engines.py; the others run the image's own config). Raises ConfigError for a bad
    tier config."""
    namespace = topology.kubernetes.namespace
    engines = tier_engines(tier_configs or {}, topology)
    remote = {name: e for name, e in engines.items() if e.config.engine == "openai"}
    in_mesh = replace(topology, tiers=tuple(t for t in topology.tiers if t.name not in remote))
    in_cluster = cluster_topology(in_mesh)
    control_port = _port(topology.control_plane)
    router_port = _port(topology.router)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "tiermesh-topology",
                "labels": metadata_labels(selector_labels("control-plane")),
            },
            "data": {"topology.yaml": dump_yaml(in_cluster)},
        },
    ]
    for tier in in_mesh.tiers:
        for cluster in tier.clusters:
            objects += _tier_objects(tier.name, cluster, topology, secure, engines.get(tier.name))
        port = serving_port(tier.name, tier.clusters[0])
        objects.append(
            service_for(
                f"tier-{tier.name}", selector_labels("tier", **{"tiermesh/tier": tier.name}), port
            )
        )

    control_labels = selector_labels("control-plane")
    control_command = [
        "python", "-m", "mesh", "serve", "--topology", f"{TOPOLOGY_MOUNT}/topology.yaml",
        "--host", "0.0.0.0", "--port", str(control_port), *_plaintext_flag(secure),
    ]  # fmt: skip
    control = container_for(
        "control-plane", control_command, control_port, topology, "control-plane"
    )
    control["ports"] = control["ports"][:1]  # the control plane exports no metrics
    control["volumeMounts"].append(
        {"name": "topology", "mountPath": TOPOLOGY_MOUNT, "readOnly": True}
    )
    volumes = [{"name": "topology", "configMap": {"name": "tiermesh-topology"}}]
    if secure:
        volumes += secure_container(control, "control-plane", "control-plane")
    objects.append(
        deployment_for("tiermesh-control-plane", control_labels, 1, control, volumes=volumes)
    )
    control_service = service_for("tiermesh-control-plane", control_labels, control_port)
    control_service["spec"]["ports"] = control_service["spec"]["ports"][:1]
    objects.append(control_service)

    router_labels = selector_labels("router")
    ports = remote_ports(topology, remote, {router_port: "the router", METRICS_PORT: "metrics"})
    targets = {t.name: f"localhost:{ports[t.name]}" if t.name in remote else xds_target(t.name)
               for t in topology.tiers}  # fmt: skip
    tiers = [arg for name, target in targets.items() for arg in ("--tier", f"{name}={target}")]
    router_command = [
        "python",
        "-m",
        "services.router",
        "--host",
        "0.0.0.0",
        "--port",
        str(router_port),
        "--metrics-port",
        str(METRICS_PORT),
        *tiers,
        *_plaintext_flag(secure),
    ]
    router = container_for("router", router_command, router_port, topology, "router")
    xds_tls = mounted_tls() if secure else None
    bootstrap = grpc_bootstrap(in_cluster.control_plane, "$(POD_NAME)", tls=xds_tls)
    router["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": BOOTSTRAP_CONFIG_ENV, "value": json.dumps(bootstrap)},
    ]
    router_volumes = secure_container(router, "router", "router") if secure else []
    adapters = []
    for name, engine in remote.items():
        base = container_for(f"tier-{name}", [], ports[name], topology, "router")
        adapter, volumes, config_map = remote_tier(
            engine, ports[name], base, metadata_labels(router_labels)
        )
        router_volumes += volumes
        if secure:
            router_volumes += secure_adapter(adapter, name)
        adapters.append(adapter)
        objects.append(config_map)
    deployment = deployment_for("tiermesh-router", router_labels, 1, router, volumes=router_volumes)
    deployment["spec"]["template"]["spec"]["containers"] += adapters
    objects.append(deployment)
    objects.append(service_for("tiermesh-router", router_labels, router_port))
    router_host = service_host("tiermesh-router", namespace)
    objects += _gateway_objects(topology, router_host, router_port, secure, cors_origins)
    objects += network_policies(APP, metadata_labels(selector_labels("network")))
    if service_monitor:
        objects.append(service_monitor_object(APP, metadata_labels(selector_labels("monitoring"))))
    for item in objects[1:]:
        item["metadata"]["namespace"] = namespace
    return objects


def _gateway_objects(
    topology: Topology,
    router_host: str,
    router_port: int,
    secure: bool = False,
    cors_origins: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """The HTTP gateway's Deployment and Service: an HTTP port and a `/health` readiness probe
    (ready while the router answers and some tier behind it can take a call), calling the
    router's Service over gRPC."""
    labels = selector_labels("gateway")
    command = [
        "python", "-m", "services.gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT),
        "--router", f"{router_host}:{router_port}",
        *(arg for origin in cors_origins for arg in ("--cors-origin", origin)),
    ]  # fmt: skip
    container = container_for("gateway", command, GATEWAY_PORT, topology, "gateway")
    container["ports"] = [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}]
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": PROBE_PERIOD_S}
    container["startupProbe"] = {
        "tcpSocket": {"port": "http"},
        "periodSeconds": PROBE_PERIOD_S,
        "failureThreshold": STARTUP_BUDGET_S["gateway"] // PROBE_PERIOD_S,
    }
    container["readinessProbe"] = probe
    container["livenessProbe"] = {
        "tcpSocket": {"port": "http"},
        "periodSeconds": PROBE_PERIOD_S,
        "failureThreshold": 6,
    }
    if "gateway" not in topology.kubernetes.resources:
        limits = {"cpu": GATEWAY_RESOURCES.cpu, "memory": GATEWAY_RESOURCES.memory}
        container["resources"] = {"requests": limits, "limits": dict(limits)}
    volumes = secure_container(container, "gateway", "gateway") if secure else []
    deployment = deployment_for("tiermesh-gateway", labels, 1, container, volumes=volumes)
    deployment["spec"]["template"]["metadata"]["annotations"] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(GATEWAY_PORT),
        "prometheus.io/path": "/metrics",
    }
    service = service_for("tiermesh-gateway", labels, GATEWAY_PORT)
    service["spec"]["ports"] = [
        {"name": "http", "port": GATEWAY_PORT, "targetPort": "http", "protocol": "TCP"}
    ]
    return [deployment, service]


def manifests_yaml(
    topology: Topology,
    service_monitor: bool = False,
    secure: bool = False,
    cors_origins: tuple[str, ...] = (),
    tier_configs: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The manifests as YAML; secure ones open with the commands that create their Secrets."""
    objects = manifests(topology, service_monitor, secure, cors_origins, tier_configs)
    text = yaml.safe_dump_all(objects, sort_keys=False)
    if not secure:
        return text
    header = ["# TLS from Secrets this file only references; create them first:"]
    header += [f"#   {line}" for line in secret_commands(topology)]
    return "\n".join(header) + "\n" + text
