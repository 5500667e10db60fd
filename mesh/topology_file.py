"""Reads a topology YAML file into a `Topology`, refusing anything invalid with an error that
names the file, the line and the field (`topology.yaml:14: tiers.large.clusters[1].weight: ...`).

Works on yaml's node tree so every value keeps its line. Knows nothing of xDS or of serving.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from mesh.topology import (
    HEALTH_STATES,
    LB_POLICIES,
    RETRY_CODES,
    Cluster,
    Endpoint,
    Kubernetes,
    Locality,
    ModelVolume,
    Resources,
    RetryPolicy,
    Tier,
    Topology,
)
from services.common.errors import ConfigError
from services.common.tiers import TIER_NAMES

NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$")  # also a valid K8s name
HOST_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")

T = TypeVar("T")


class TopologyError(ConfigError):
    """A topology file is invalid; the message names the file, line and field."""


class _Field:
    """A yaml node with its dotted path, so every check can say where it failed."""

    def __init__(self, node: yaml.Node, path: str, source: str) -> None:
        self.node = node
        self.path = path
        self.source = source

    def fail(self, message: str) -> TopologyError:
        line = self.node.start_mark.line + 1
        return TopologyError(f"{self.source}:{line}: {self.path or '(top level)'}: {message}")

    def mapping(self, known: tuple[str, ...]) -> dict[str, _Field]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.fail("expected a mapping")
        fields: dict[str, _Field] = {}
        for key_node, value_node in self.node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            path = f"{self.path}.{key}" if self.path else str(key)
            if not isinstance(key, str) or key not in known:
                where = _Field(key_node, path, self.source)
                raise where.fail(f"unknown field (known: {', '.join(known)})")
            if key in fields:
                raise _Field(key_node, path, self.source).fail("given twice")
            fields[key] = _Field(value_node, path, self.source)
        return fields

    def sequence(self) -> list[_Field]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.fail("expected a list")
        return [_Field(n, f"{self.path}[{i}]", self.source) for i, n in enumerate(self.node.value)]

    def scalar(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.fail("expected a single value")
        loader = yaml.SafeLoader("")
        try:
            return loader.construct_object(self.node)
        finally:
            loader.dispose()

    def text(self, pattern: re.Pattern[str] | None = None, allow_empty: bool = False) -> str:
        value = self.scalar()
        if not isinstance(value, str) or not (value or allow_empty):
            raise self.fail(f"expected a non-empty string, got {value!r}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(f"{value!r} does not match {pattern.pattern}")
        return value

    def integer(self, low: int, high: int) -> int:
        value = self.scalar()
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(f"expected an integer in [{low}, {high}], got {value!r}")
        return value

    def number(self, low: float, high: float) -> float:
        value = self.scalar()
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not low < float(value) <= high:
            raise self.fail(f"expected a number in ({low}, {high}], got {value!r}")
        return float(value)

    def choice(self, choices: tuple[str, ...]) -> str:
        value = self.scalar()
        if value not in choices:
            raise self.fail(f"{value!r} is not one of {', '.join(choices)}")
        return str(value)


def _optional(fields: dict[str, _Field], key: str, read: Callable[[_Field], T], default: T) -> T:
    return read(fields[key]) if key in fields else default


def _required(fields: dict[str, _Field], key: str, parent: _Field) -> _Field:
    if key not in fields:
        raise parent.fail(f"missing field {key!r}")
    return fields[key]


def load_topology(path: Path) -> Topology:
    """Reads and checks `path`; raises TopologyError (a ConfigError) naming file, line and field."""
    try:
        text = path.read_text()
    except OSError as e:
        raise TopologyError(f"{path}: cannot read: {e.strerror or e}") from None
    return parse_topology(text, str(path))


def parse_topology(text: str, source: str = "<topology>") -> Topology:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"{mark.line + 1}:" if mark is not None else ""
        raise TopologyError(f"{source}:{line} not valid YAML: {e}") from None
    if root is None:
        raise TopologyError(f"{source}: empty file (expected a mapping with `tiers`)")
    top = _Field(root, "", source)
    fields = top.mapping(("control_plane", "router", "tiers", "envoy", "kubernetes"))
    tiers_field = _required(fields, "tiers", top)
    tiers = tuple(_tier(name, field) for name, field in tiers_field.mapping(TIER_NAMES).items())
    if not tiers:
        raise tiers_field.fail("at least one tier is needed")
    _check_unique_clusters(tiers_field, tiers)
    no_fields: dict[str, _Field] = {}
    envoy = _optional(
        fields, "envoy", lambda f: f.mapping(("listen_address", "base_port")), no_fields
    )
    topology = Topology(
        tiers,
        control_plane=_optional(fields, "control_plane", _address_section, Topology.control_plane),
        router=_optional(fields, "router", _address_section, Topology.router),
        envoy_listen_address=_optional(
            envoy, "listen_address", lambda f: f.text(HOST_PATTERN), Topology.envoy_listen_address
        ),
        envoy_base_port=_optional(
            envoy, "base_port", lambda f: f.integer(1, 65533), Topology.envoy_base_port
        ),
        kubernetes=_optional(fields, "kubernetes", _kubernetes, Kubernetes()),
    )
    return topology


def _address_section(field: _Field) -> str:
    host, port = _host_port(_required(field.mapping(("address",)), "address", field))
    return f"{host}:{port}"


def _tier(name: str, field: _Field) -> Tier:
    fields = field.mapping(("timeout_s", "retry", "clusters"))
    clusters_field = _required(fields, "clusters", field)
    clusters = tuple(_cluster(item) for item in clusters_field.sequence())
    if not clusters:
        raise clusters_field.fail("at least one cluster is needed")
    return Tier(
        name,
        clusters,
        timeout_s=_optional(fields, "timeout_s", lambda f: f.number(0.0, 86400.0), None),
        retry=_optional(fields, "retry", _retry, None),
    )


def _cluster(field: _Field) -> Cluster:
    fields = field.mapping(("name", "weight", "lb_policy", "endpoints"))
    endpoints_field = _required(fields, "endpoints", field)
    endpoints = tuple(_endpoint(item) for item in endpoints_field.sequence())
    seen: set[str] = set()
    for item, endpoint in zip(endpoints_field.sequence(), endpoints, strict=True):
        if endpoint.address in seen:
            raise item.fail(f"endpoint {endpoint.address} listed twice in this cluster")
        seen.add(endpoint.address)
    return Cluster(
        name=_required(fields, "name", field).text(NAME_PATTERN),
        endpoints=endpoints,
        weight=_optional(fields, "weight", lambda f: f.integer(1, 1_000_000), 1),
        lb_policy=_optional(fields, "lb_policy", lambda f: f.choice(LB_POLICIES), "round_robin"),
    )


def _endpoint(field: _Field) -> Endpoint:
    fields = field.mapping(("address", "locality", "weight", "health"))
    host, port = _host_port(_required(fields, "address", field))
    return Endpoint(
        host,
        port,
        locality=_optional(fields, "locality", _locality, Locality()),
        weight=_optional(fields, "weight", lambda f: f.integer(1, 1_000_000), 1),
        health=_optional(fields, "health", lambda f: f.choice(HEALTH_STATES), "healthy"),
    )


def _host_port(field: _Field) -> tuple[str, int]:
    value = field.text()
    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise field.fail(f"expected HOST:PORT with a port in [1, 65535], got {value!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not HOST_PATTERN.match(host):
            raise field.fail(f"{host!r} is neither an IP address nor a host name") from None
    return host, int(port_text)


def _locality(field: _Field) -> Locality:
    fields = field.mapping(("region", "zone", "sub_zone"))
    return Locality(
        region=_optional(fields, "region", lambda f: f.text(), "local"),
        zone=_optional(fields, "zone", lambda f: f.text(allow_empty=True), ""),
        sub_zone=_optional(fields, "sub_zone", lambda f: f.text(allow_empty=True), ""),
    )


def _retry(field: _Field) -> RetryPolicy:
    fields = field.mapping(("retry_on", "num_retries", "base_interval_ms", "max_interval_ms"))
    retry_on = _optional(
        fields, "retry_on", lambda f: tuple(item.choice(RETRY_CODES) for item in f.sequence()), None
    )
    if retry_on is not None and not retry_on:
        raise fields["retry_on"].fail("name at least one status code")
    policy = RetryPolicy(
        retry_on=retry_on or RetryPolicy.retry_on,
        num_retries=_optional(fields, "num_retries", lambda f: f.integer(1, 4), 1),
        base_interval_ms=_optional(fields, "base_interval_ms", lambda f: f.integer(1, 60000), 25),
        max_interval_ms=_optional(fields, "max_interval_ms", lambda f: f.integer(1, 60000), 250),
    )
    if policy.max_interval_ms < policy.base_interval_ms:
        where = fields.get("max_interval_ms", field)
        raise where.fail("must be >= base_interval_ms")
    return policy


def _kubernetes(field: _Field) -> Kubernetes:
    fields = field.mapping(("namespace", "image", "resources", "vllm_image", "models"))
    resources: dict[str, Resources] = {}
    if "resources" in fields:
        names = (*TIER_NAMES, "router", "control-plane", "gateway")
        for name, item in fields["resources"].mapping(names).items():
            parts = item.mapping(("cpu", "memory", "gpu"))
            resources[name] = Resources(
                cpu=str(_required(parts, "cpu", item).scalar()),
                memory=_required(parts, "memory", item).text(),
                gpu=_optional(parts, "gpu", lambda f: f.integer(0, 16), 0),
            )
    models: dict[str, ModelVolume] = {}
    for name, item in fields["models"].mapping(TIER_NAMES).items() if "models" in fields else ():
        parts = item.mapping(("claim", "sub_path"))
        models[name] = ModelVolume(
            claim=_required(parts, "claim", item).text(NAME_PATTERN),
            sub_path=_optional(parts, "sub_path", _sub_path, ""),
        )
    return Kubernetes(
        namespace=_optional(fields, "namespace", lambda f: f.text(NAME_PATTERN), "tiermesh"),
        image=_optional(fields, "image", lambda f: f.text(), Kubernetes.image),
        resources=resources,
        vllm_image=_optional(fields, "vllm_image", lambda f: f.text(), Kubernetes.vllm_image),
        models=models,
    )


def _sub_path(field: _Field) -> str:
    """A relative path inside a volume: no leading "/", no ".." (Kubernetes refuses both)."""
    value = field.text(allow_empty=True)
    if value.startswith("/") or ".." in value.split("/"):
        raise field.fail(f"{value!r}: expected a relative path without '..'")
    return value


def _check_unique_clusters(tiers_field: _Field, tiers: tuple[Tier, ...]) -> None:
    seen: dict[str, str] = {}
    for tier in tiers:
        for cluster in tier.clusters:
            if cluster.name in seen:
                raise tiers_field.fail(
                    f"cluster name {cluster.name!r} used by tiers {seen[cluster.name]} "
                    f"and {tier.name}: cluster names must be unique"
                )
            seen[cluster.name] = tier.name
