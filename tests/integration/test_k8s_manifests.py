"""What a platform team applies: `tiermesh mesh k8s` objects validate against the Kubernetes
1.37 schemas and carry startup probes, a metrics port with scrape annotations, a PDB and an HPA
per tier, GPU requests where the topology asks, the recommended labels with stable selectors,
a writable /tmp on a read-only root filesystem, and no service account token; `--secure` ones
mount certificates read-only from Secrets they only reference, probe health over TLS with an
exec probe, and point the router's xDS client at the control plane over mTLS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from cryptography import x509

from mesh.bootstrap import BOOTSTRAP_CONFIG_ENV, bootstrap_problems
from mesh.k8s import cluster_topology, manifests, manifests_yaml
from mesh.k8s_objects import METRICS_PORT
from mesh.k8s_tls import (
    CA_SECRET,
    KEYS_MOUNT,
    KEYS_SECRET,
    ROUTER_ID,
    TLS_MOUNT,
    identities,
    tls_secret,
)
from mesh.topology_file import parse_topology
from services.security.certs import init_ca, issue
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


def _containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: deployment["spec"]["template"]["spec"]["containers"][0]
        for name, deployment in _by(objects, "Deployment").items()
    }


def test_plaintext_services_say_insecure_out_loud() -> None:
    for name, container in _containers(_objects()).items():
        if name != "tiermesh-gateway":  # HTTP; it does not bind gRPC
            assert "--insecure" in container["command"], name
            assert "grpc" in container["readinessProbe"]


def test_secure_manifests_mount_certificates_from_secrets_and_probe_over_tls() -> None:
    objects = _objects(secure=True)
    for item in objects:
        kubernetes_validate.validate(item, "1.37.0", strict=True)
    assert "Secret" not in {o["kind"] for o in objects}
    deployments = _by(objects, "Deployment")
    for name, container in _containers(objects).items():
        assert "--insecure" not in container["command"], name
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TIERMESH_TLS_CERT"] == f"{TLS_MOUNT}/tls.crt"
        assert {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True} in container[
            "volumeMounts"
        ]
        volumes = {v["name"]: v for v in deployments[name]["spec"]["template"]["spec"]["volumes"]}
        sources = [s["secret"]["name"] for s in volumes["tls"]["projected"]["sources"]]
        identity = "tier/" + name.split("-")[1] if name.startswith("tier-") else name[9:]
        assert sources == [tls_secret(identity), CA_SECRET]
        if name.startswith("tier-") or name == "tiermesh-control-plane":
            assert env["TIERMESH_ALLOWED_CALLERS"] == ROUTER_ID
        if name != "tiermesh-gateway":  # router clients; control plane and tier admin (swap)
            assert env["TIERMESH_KEYS_FILE"] == f"{KEYS_MOUNT}/keys.json"
            assert volumes["api-keys"]["secret"]["secretName"] == KEYS_SECRET
        else:
            assert "TIERMESH_KEYS_FILE" not in env and "api-keys" not in volumes
        if name == "tiermesh-gateway":
            assert "httpGet" in container["readinessProbe"]
            continue
        grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command[:3] == ["python", "-m", "services.security.health_probe"]
            assert command[-1] == str(grpc_port)
    router_env = {e["name"]: e.get("value") for e in _containers(objects)["tiermesh-router"]["env"]}
    bootstrap = json.loads(router_env[BOOTSTRAP_CONFIG_ENV])
    assert bootstrap_problems(bootstrap) == []
    (creds,) = bootstrap["xds_servers"][0]["channel_creds"]
    assert creds["type"] == "tls"
    assert creds["config"]["certificate_file"] == f"{TLS_MOUNT}/tls.crt"


def test_secure_yaml_holds_no_private_key_and_says_how_to_make_the_secrets() -> None:
    text = manifests_yaml(parse_topology(VALID), secure=True)
    assert "PRIVATE KEY" not in text
    assert "kubectl -n tiermesh create secret tls tiermesh-tls-router" in text
    assert next(iter(yaml.safe_load_all(text)))["kind"] == "Namespace"


def test_the_certificates_the_commands_issue_name_what_clients_dial(tmp_path: Path) -> None:
    topology = parse_topology(VALID)
    init_ca(tmp_path)
    for identity, hosts in identities(topology).items():
        issued = issue(tmp_path, identity, hosts=hosts)
        certificate = x509.load_pem_x509_certificate(issued.cert.read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        dns = set(names.value.get_values_for_type(x509.DNSName))
        assert "localhost" in dns  # the exec probe dials localhost
        if identity.startswith("tier/"):
            assert f"tier-{identity[5:]}" in dns  # the router dials xds:///tier-NAME
    in_cluster = cluster_topology(topology).control_plane.rpartition(":")[0]
    assert in_cluster in identities(topology)["control-plane"]


def test_cors_origins_reach_the_gateway_and_a_bad_one_is_refused() -> None:
    objects = _objects(cors_origins=("https://app.example", "*"))
    for item in objects:
        kubernetes_validate.validate(item, "1.37.0", strict=True)
    command = _by(objects, "Deployment")["tiermesh-gateway"]["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    assert command[-4:] == ["--cors-origin", "https://app.example", "--cors-origin", "*"]
    router = _by(objects, "Deployment")["tiermesh-router"]["spec"]["template"]["spec"]
    assert "--cors-origin" not in router["containers"][0]["command"]
    bad = subprocess.run(
        [sys.executable, "-m", "services.cli", "mesh", "k8s", "--cors-origin", "app.example"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "cors_origins[0]" in bad.stderr, bad.stderr
