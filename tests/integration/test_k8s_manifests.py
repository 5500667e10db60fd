"""What a platform team applies: `tiermesh mesh k8s` objects validate against the Kubernetes
1.37 schemas and carry startup probes, a metrics port with scrape annotations, a PDB and an HPA
per tier, GPU requests where the topology asks, the recommended labels with stable selectors,
a writable /tmp on a read-only root filesystem, and no service account token."""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from mesh.k8s import METRICS_PORT, manifests
from mesh.topology_file import parse_topology
from tests.integration.test_mesh_topology import VALID

GPU_TOPOLOGY = VALID + "kubernetes:\n  resources:\n    large: {cpu: '4', memory: 16Gi, gpu: 1}\n"


def _objects(text: str = VALID, **options: Any) -> list[dict[str, Any]]:
    return manifests(parse_topology(text), **options)


def _by(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_object_validates_and_tiers_get_budgets_and_autoscalers() -> None:
    objects = _objects()
    for item in objects:
        kubernetes_validate.validate(item, "1.37.0", strict=True)
    tiers = [n for n, d in _by(objects, "Deployment").items() if n.startswith("tier-")]
    assert tiers and sorted(_by(objects, "PodDisruptionBudget")) == sorted(tiers)
    autoscalers = _by(objects, "HorizontalPodAutoscaler")
    assert sorted(autoscalers) == sorted(tiers)
    for name in tiers:
        deployment = _by(objects, "Deployment")[name]
        budget = _by(objects, "PodDisruptionBudget")[name]
        assert (
            budget["spec"]["selector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )
        hpa = autoscalers[name]["spec"]
        assert hpa["scaleTargetRef"]["name"] == name
        assert hpa["minReplicas"] == deployment["spec"]["replicas"] < hpa["maxReplicas"]


def test_probes_metrics_labels_and_pod_security() -> None:
    for name, deployment in _by(_objects(), "Deployment").items():
        pod = deployment["spec"]["template"]
        container = pod["spec"]["containers"][0]
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"][
            "periodSeconds"
        ] >= (300 if name.startswith("tier-") else 60)
        assert "initialDelaySeconds" not in container["livenessProbe"]
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        labels = deployment["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "tiermesh"
        assert "app.kubernetes.io/version" in labels
        assert "app.kubernetes.io/version" not in deployment["spec"]["selector"]["matchLabels"]
        if name.startswith("tier-") or name == "tiermesh-router":
            assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in (
                container["ports"]
            )
            assert "--metrics-port" in container["command"]
            assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(METRICS_PORT)


def test_gpu_tiers_request_gpus_and_tolerate_gpu_nodes() -> None:
    deployments = _by(_objects(GPU_TOPOLOGY), "Deployment")
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        limits = pod["containers"][0]["resources"]["limits"]
        if name.startswith("tier-large"):
            assert limits["nvidia.com/gpu"] == "1"
            assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
            kubernetes_validate.validate(deployment, "1.37.0", strict=True)
        else:
            assert "nvidia.com/gpu" not in limits


def test_service_monitor_on_request() -> None:
    assert "ServiceMonitor" not in {o["kind"] for o in _objects()}
    monitors = _by(_objects(service_monitor=True), "ServiceMonitor")
    endpoints = monitors["tiermesh"]["spec"]["endpoints"]
    assert endpoints == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]


def test_network_policies_let_only_the_router_reach_tiers_and_control_plane() -> None:
    objects = _objects()
    policies = _by(objects, "NetworkPolicy")
    for policy in policies.values():
        kubernetes_validate.validate(policy, "1.37.0", strict=True)
    deny = policies["tiermesh-default-deny-ingress"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    router = {"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "tiermesh", "app.kubernetes.io/component": "router"
    }}}  # fmt: skip
    for name in ("tiermesh-tiers-from-router", "tiermesh-control-plane-from-router"):
        grpc_rule = policies[name]["spec"]["ingress"][0]
        assert grpc_rule["from"] == [router]
        assert grpc_rule["ports"] == [{"protocol": "TCP", "port": "grpc"}]
    tiers = policies["tiermesh-tiers-from-router"]["spec"]["podSelector"]["matchLabels"]
    tier_pods = [
        d["spec"]["template"]["metadata"]["labels"]
        for n, d in _by(objects, "Deployment").items()
        if n.startswith("tier-")
    ]
    assert tier_pods and all(tiers.items() <= pod.items() for pod in tier_pods)
