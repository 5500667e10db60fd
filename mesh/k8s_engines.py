"""Tiers in the Kubernetes manifests whose engine is not the image's own (`tiermesh mesh k8s
--tier-config TIER=FILE`, a tier config with `engine = "vllm"` or `"openai"`).

- vllm: the tier's pod runs vLLM's image with the config from a ConfigMap, requests
  tensor_parallel_size x pipeline_parallel_size GPUs (on one node), mounts a memory-backed
  /dev/shm (vLLM's workers share tensors through it) and its model read-only from a
  PersistentVolumeClaim, and has a startup budget of minutes for the load.
- openai (a remote OpenAI-compatible server): no tier pod. The tier's adapter (the openai engine,
  a light process with no model) runs beside the router in the router's pod, listening on
  localhost, with the server's URL in its config; the router calls it at localhost:PORT instead
  of through xDS.

Plain dictionaries; knows nothing of serving, of vLLM or of the OpenAI API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from mesh.k8s_tls import TLS_MOUNT, secure_container
from mesh.topology import ModelVolume, Resources, Topology, serving_port
from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.common.errors import ConfigError

ENGINES = ("vllm", "openai")  # what --tier-config may name; the others run the image's config
CONFIG_MOUNT = "/etc/tiermesh/tier"
MODEL_MOUNT = "/models"
SHM_SIZE = "8Gi"  # vLLM's workers (tensor parallel) exchange tensors through /dev/shm
VLLM_TMP_SIZE = "8Gi"  # HOME=/tmp: torch.compile, Triton and vLLM's caches
# Loading a model onto GPUs, profiling memory and capturing CUDA graphs: ~30 s for a 135M
# model on this CPU, minutes for a 70B one over several GPUs.
VLLM_STARTUP_BUDGET_S = 900
REMOTE_RESOURCES = Resources("500m", "512Mi")  # the adapter holds no model
REMOTE_SECRET_MOUNT = "/etc/tiermesh/remote"


@dataclass(frozen=True)
class TierEngine:
    """One tier's config as given (`data`, the TOML's fields) and checked (`config`)."""

    tier: str
    config: TierConfig
    data: Mapping[str, Any]

    @property
    def gpus(self) -> int:
        """GPUs the tier's pod requests: one per vLLM worker on CUDA, none on a CPU."""
        if self.config.engine != "vllm" or self.config.device == "cpu":
            return 0
        return self.config.tensor_parallel_size * self.config.pipeline_parallel_size


def tier_engines(
    configs: Mapping[str, Mapping[str, Any]], topology: Topology
) -> dict[str, TierEngine]:
    """The tier configs given for the manifests, checked: each names a tier of the topology,
    its engine is vllm or openai, its fields are valid, and the topology's GPU count (if it
    gives one) is the vLLM tier's. Raises ConfigError naming the tier and the field."""
    tiers = {tier.name for tier in topology.tiers}
    engines: dict[str, TierEngine] = {}
    for tier, data in configs.items():
        if tier not in tiers:
            raise ConfigError(f"tier config {tier}: the topology has no tier {tier!r}")
        if data.get("name", tier) != tier:
            raise ConfigError(f"tier config {tier}: name = {data['name']!r}, expected {tier!r}")
        try:
            config = build_config(TierConfig, {"model_path": "model", **data, "name": tier})
        except ConfigError as e:
            raise ConfigError(f"tier config {tier}: {e}") from None
        if config.engine not in ENGINES:
            raise ConfigError(
                f"tier config {tier}: engine = {config.engine!r}: give one for "
                f"{' or '.join(ENGINES)} (a tier on another engine runs the image's own config)"
            )
        engine = TierEngine(tier, config, dict(data))
        gpu = topology.kubernetes.resources_for(tier).gpu
        if gpu and gpu != engine.gpus:
            raise ConfigError(
                f"kubernetes.resources.{tier}.gpu = {gpu}, but the tier's vLLM config asks for "
                f"{engine.gpus} (tensor_parallel_size x pipeline_parallel_size on device "
                f"{config.device!r}): leave gpu out or make them equal"
            )
        engines[tier] = engine
    if tiers and all(engines.get(t) and engines[t].config.engine == "openai" for t in tiers):
        raise ConfigError("every tier is remote (engine openai): at least one must run in the mesh")
    return engines


def _toml(data: Mapping[str, Any], header: str) -> str:
    """Flat TOML (a tier config has no tables): each value as JSON, which TOML reads alike."""
    lines = [f"# {header}"] + [f"{key} = {json.dumps(value)}" for key, value in data.items()]
    return "\n".join(lines) + "\n"


def _config_map(name: str, labels: dict[str, str], data: Mapping[str, Any], header: str) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"config.toml": _toml(data, header)},
    }


def config_map_name(tier: str) -> str:
    return f"tiermesh-tier-{tier}-config"


def remote_secret(tier: str) -> str:
    """The Secret a remote tier's adapter reads its server's API key (`api-key`) and CA
    (`ca.crt`) from, when its config names them."""
    return f"tiermesh-remote-{tier}"


def model_volume(topology: Topology, tier: str) -> ModelVolume:
    return topology.kubernetes.models.get(tier, ModelVolume(f"tiermesh-model-{tier}"))


def vllm_tier(
    engine: TierEngine,
    topology: Topology,
    container: dict[str, Any],
    probe_period_s: int,
    labels: dict[str, str],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Turns a tier's `container` (built like every tier's) into vLLM's, in place; returns the
    volumes its pod adds and the ConfigMap that holds its config."""
    tier = engine.tier
    flags = container["command"][3:]  # --host, --port, --metrics-port[, --insecure]
    config_file = f"{CONFIG_MOUNT}/config.toml"
    container["image"] = topology.kubernetes.vllm_image
    container["command"] = [
        "python", "-m", "services.tier.vllm_server", "--config", config_file,
        "--model", MODEL_MOUNT, *flags,
    ]  # fmt: skip
    limits = container["resources"]["limits"]
    if engine.gpus:
        limits["nvidia.com/gpu"] = str(engine.gpus)
        container["resources"]["requests"]["nvidia.com/gpu"] = str(engine.gpus)
    container["startupProbe"]["failureThreshold"] = VLLM_STARTUP_BUDGET_S // probe_period_s
    container["env"] = [
        {"name": "HOME", "value": "/tmp"},  # caches on the writable /tmp (read-only root)
        {"name": "HF_HUB_OFFLINE", "value": "1"},  # the model is the volume's; never a hub's
    ]
    volume = model_volume(topology, tier)
    model_mount = {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}
    if volume.sub_path:
        model_mount["subPath"] = volume.sub_path
    container["volumeMounts"] += [
        {"name": "dshm", "mountPath": "/dev/shm"},
        model_mount,
        {"name": "tier-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
    ]
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        {"name": "model", "persistentVolumeClaim": {"claimName": volume.claim, "readOnly": True}},
        {"name": "tier-config", "configMap": {"name": config_map_name(tier)}},
    ]
    data = {**engine.data, "name": tier, "model_path": MODEL_MOUNT}
    header = f"tier {tier} on vLLM (tiermesh mesh k8s --tier-config)"
    return volumes, _config_map(config_map_name(tier), labels, data, header)


def remote_tier(
    engine: TierEngine, port: int, base: dict[str, Any], labels: dict[str, str]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The adapter container of a remote tier for the router's pod, from `base` (a container
    built like every service's), listening on localhost:`port`; the volumes it adds and the
    ConfigMap of its config. It has no probes: it waits for its server by itself and is
    NOT_SERVING while the server does not answer, which the router reads and routes around; a
    probe on SERVING would restart it for its server's outage (liveness) or take the router's
    pod out of its Service (readiness). A crashed adapter is restarted as any container."""
    tier, config = engine.tier, engine.config
    mount = f"{CONFIG_MOUNT}-{tier}"
    probes = ("startupProbe", "readinessProbe", "livenessProbe", "ports")
    container = {key: value for key, value in base.items() if key not in probes}
    container.update(
        name=f"tier-{tier}",
        command=[
            "python",
            "-m",
            f"services.tier_{tier}",
            "--config",
            f"{mount}/config.toml",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
        ],
        volumeMounts=[
            *base["volumeMounts"],
            {"name": f"tier-{tier}-config", "mountPath": mount, "readOnly": True},
        ],
    )
    amounts = {"cpu": REMOTE_RESOURCES.cpu, "memory": REMOTE_RESOURCES.memory}
    container["resources"] = {"requests": amounts, "limits": dict(amounts)}
    volumes = [{"name": f"tier-{tier}-config", "configMap": {"name": config_map_name(tier)}}]
    data = {**engine.data, "name": tier}
    secret_items = []
    if config.remote_api_key_env:
        key = {"name": remote_secret(tier), "key": "api-key"}
        container["env"] = [{"name": config.remote_api_key_env, "valueFrom": {"secretKeyRef": key}}]
    if str(config.remote_ca_file) not in ("", "."):
        secret_items.append({"key": "ca.crt", "path": "ca.crt"})
        data["remote_ca_file"] = str(PurePosixPath(REMOTE_SECRET_MOUNT) / tier / "ca.crt")
    if secret_items:
        container["volumeMounts"].append(
            {"name": f"tier-{tier}-remote", "mountPath": f"{REMOTE_SECRET_MOUNT}/{tier}",
             "readOnly": True}
        )  # fmt: skip
        volumes.append(
            {
                "name": f"tier-{tier}-remote",
                "secret": {"secretName": remote_secret(tier), "items": secret_items},
            }
        )
    header = f"tier {tier} served by {config.remote_url} (tiermesh mesh k8s --tier-config)"
    return container, volumes, _config_map(config_map_name(tier), labels, data, header)


def remote_ports(
    topology: Topology, remote: Mapping[str, TierEngine], taken: Mapping[int, str]
) -> dict[str, int]:
    """The localhost port of each remote tier's adapter in the router's pod: its topology
    port, which must differ from the `taken` ones (port -> user) and from each other's."""
    used = dict(taken)
    ports = {}
    for name in remote:
        port = serving_port(name, topology.tier(name).clusters[0])
        if port in used:
            raise ConfigError(
                f"tier {name} is remote: its adapter in the router's pod needs port {port}, "
                f"which {used[port]} uses; give the tier another port in the topology"
            )
        used[port] = f"tier {name}'s adapter"
        ports[name] = port
    return ports


def secure_adapter(adapter: dict[str, Any], tier: str) -> list[dict[str, Any]]:
    """TLS on a remote tier's adapter (in place) with the tier's identity: the router dials it
    over mTLS, as any tier. Returns its pod volumes, named apart from the router's own (the
    API keys' volume is the router's)."""
    renamed = f"tls-tier-{tier}"
    volumes = secure_container(adapter, f"tier/{tier}", "tier")
    for mount in adapter["volumeMounts"]:
        if mount["name"] == "tls" and mount["mountPath"] == TLS_MOUNT:
            mount["name"] = renamed
    return [{**v, "name": renamed} for v in volumes if v["name"] == "tls"]
