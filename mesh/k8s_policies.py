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
