"""The Kubernetes objects every workload of the mesh is built from: a container with native
`grpc:` startup, readiness and liveness probes, requests and limits (and `nvidia.com/gpu` where the
topology asks), a non-root read-only securityContext and an emptyDir for /tmp; a Deployment with
Prometheus scrape annotations for its `metrics` port (and a GPU toleration); a Service with a port
named `grpc` and a `metrics` port; labels from the recommended `app.kubernetes.io/*` set, with
selectors on the stable ones only.

Plain dictionaries; knows nothing of which services the mesh runs, their command lines, TLS or
engines (k8s.py and its siblings put the objects together).
"""

from __future__ import annotations

from typing import Any

from mesh.topology import Topology

APP = "tiermesh"
VERSION = "0.1.0"
RUN_AS_USER = 10001
METRICS_PORT = 9464
# How long a service may take from container start to SERVING before Kubernetes restarts it,
# in probe periods of 5 s. A tier loads its model first: the built-in ones took 9-12 s here
# (`tiermesh run` prints each service's start-up time), a 135M-parameter model ~30 s; five
# minutes leave room for a larger model on a slow node. The rest start in a few seconds.
PROBE_PERIOD_S = 5
STARTUP_BUDGET_S = {"tier": 300, "router": 60, "control-plane": 60, "gateway": 60}


def selector_labels(component: str, **extra: str) -> dict[str, str]:
    """The selector labels of a component: stable across versions (selectors are immutable)."""
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component, **extra}


def metadata_labels(selector: dict[str, str]) -> dict[str, str]:
    """Selector labels plus the rest of the recommended set, for objects' metadata."""
    return {
        **selector,
        "app.kubernetes.io/part-of": APP,
        "app.kubernetes.io/version": VERSION,
        "app.kubernetes.io/managed-by": "tiermesh-mesh-k8s",
    }


def service_host(name: str, namespace: str) -> str:
    """A Service's DNS name inside the cluster."""
    return f"{name}.{namespace}.svc.cluster.local"


def container_for(
    name: str, command: list[str], port: int, topology: Topology, service: str
) -> dict[str, Any]:
    """A container serving gRPC on `port`, probed there; `service` names its resources in the
    topology and its start-up budget (a tier's unless STARTUP_BUDGET_S names it)."""
    resources = topology.kubernetes.resources_for(service)
    probe = {"grpc": {"port": port}, "periodSeconds": PROBE_PERIOD_S}
    kind = "tier" if service not in STARTUP_BUDGET_S else service
    amounts = {"cpu": resources.cpu, "memory": resources.memory}
    if resources.gpu:
        amounts["nvidia.com/gpu"] = str(resources.gpu)
    return {
        "name": name,
        "image": topology.kubernetes.image,
        "command": command,
        "ports": [
            {"name": "grpc", "containerPort": port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "startupProbe": {**probe, "failureThreshold": STARTUP_BUDGET_S[kind] // PROBE_PERIOD_S},
        "readinessProbe": probe,
        "livenessProbe": {**probe, "failureThreshold": 6},
        "resources": {"requests": amounts, "limits": dict(amounts)},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def deployment_for(
    name: str, labels: dict[str, str], replicas: int, container: dict[str, Any], **pod: Any
) -> dict[str, Any]:
    """`labels` are the selector labels; `pod` adds to the pod spec (volumes are appended to the
    /tmp emptyDir every pod has)."""
    volumes = [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}, *pod.pop("volumes", [])]
    annotations = {}
    if any(p["name"] == "metrics" for p in container["ports"]):
        annotations = {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
        }
    if "nvidia.com/gpu" in container["resources"]["limits"]:
        pod.setdefault("tolerations", []).append(
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": metadata_labels(labels)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": metadata_labels(labels), "annotations": annotations},
                "spec": {
                    "automountServiceAccountToken": False,
                    "volumes": volumes,
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


def service_for(
    name: str, selector: dict[str, str], port: int, headless: bool = False
) -> dict[str, Any]:
    """A Service with `grpc` and `metrics` ports; `headless`: one DNS record per ready pod."""
    spec: dict[str, Any] = {
        "selector": selector,
        "ports": [
            {"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"},
            {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
        ],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = False
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": metadata_labels(selector)},
        "spec": spec,
    }
