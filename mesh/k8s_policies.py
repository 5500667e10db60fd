"""Kubernetes objects that keep the mesh's workloads available and scaled: a PodDisruptionBudget
and a HorizontalPodAutoscaler per tier Deployment, and an optional Prometheus Operator
ServiceMonitor for every service's metrics port. Plain dictionaries; knows nothing of serving.

The HPA scales on CPU, which every cluster has. Scaling a tier on its queue depth
(`tiermesh_tier_queue_depth`) needs a custom-metrics adapter (e.g. prometheus-adapter) exposing
it as a Pods metric; the README shows the metric block to swap in.
"""

from __future__ import annotations

from typing import Any

HPA_CPU_UTILISATION = 70  # percent of the CPU request
HPA_MAX_FACTOR = 4  # at most this many times the topology's replica count


def disruption_budget(
    name: str, selector: dict[str, str], labels: dict[str, str]
) -> dict[str, Any]:
    """At most one pod of the Deployment down for a voluntary disruption (a node drain): with
    several replicas the rest keep serving, with one the drain is not blocked forever."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }


def autoscaler(name: str, replicas: int, labels: dict[str, str]) -> dict[str, Any]:
    """CPU-based scaling of the Deployment `name` between its replicas and HPA_MAX_FACTOR times
    as many."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": replicas,
            "maxReplicas": max(replicas * HPA_MAX_FACTOR, 2),
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {
                            "type": "Utilization",
                            "averageUtilization": HPA_CPU_UTILISATION,
                        },
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
        },
    }


def service_monitor(app: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Prometheus Operator ServiceMonitor scraping the `metrics` port of every tiermesh
    Service (only for clusters running the operator: `tiermesh mesh k8s --service-monitor`)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": app, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/part-of": app}},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def network_policies(app: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Ingress rules for the namespace: nothing reaches a pod unless allowed below. Tiers take
    gRPC only from the router; the control plane only from the router (its xDS client); the
    router from anywhere (its clients: the gateway, services, `tiermesh chat`); the gateway
    from anywhere; every metrics port from anywhere (Prometheus usually lives in another
    namespace). Ports are the containers' named ports."""

    def selector(component: str) -> dict[str, Any]:
        return {
            "matchLabels": {"app.kubernetes.io/name": app, "app.kubernetes.io/component": component}
        }

    def policy(name: str, pods: dict[str, Any], rules: list[dict[str, Any]]) -> dict[str, Any]:
        spec: dict[str, Any] = {"podSelector": pods, "policyTypes": ["Ingress"]}
        if rules:
            spec["ingress"] = rules
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }

    def ports(*names: str) -> list[dict[str, Any]]:
        return [{"protocol": "TCP", "port": name} for name in names]

    from_router = [{"podSelector": selector("router")}]
    metrics = {"ports": ports("metrics")}
    return [
        policy(f"{app}-default-deny-ingress", {}, []),
        policy(
            f"{app}-tiers-from-router",
            selector("tier"),
            [{"from": from_router, "ports": ports("grpc")}, metrics],
        ),
        policy(
            f"{app}-control-plane-from-router",
            selector("control-plane"),
            [{"from": from_router, "ports": ports("grpc")}],
        ),
        policy(f"{app}-router-ingress", selector("router"), [{"ports": ports("grpc")}, metrics]),
        policy(f"{app}-gateway-ingress", selector("gateway"), [{"ports": ports("http")}]),
    ]
