"""The topology file and everything generated from it: validation with file:line:field errors,
snapshots refused when inconsistent, Kubernetes manifests checked against the Kubernetes JSON
schemas (kubernetes-validate, offline), the Envoy and gRPC bootstraps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from google.protobuf import json_format

from mesh.bootstrap import XdsTls, envoy_bootstrap, grpc_bootstrap
from mesh.cli import DEFAULT_TOPOLOGY
from mesh.k8s import manifests
from mesh.resources import CLUSTER, ENDPOINT, ENVOY, LISTENER, PROXYLESS, ROUTE, build_resources
from mesh.snapshot import InconsistentSnapshot, Snapshot, SnapshotCache
from mesh.topology import Cluster, Endpoint, dump_yaml, local_topology, serving_port
from mesh.topology_file import TopologyError, load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]

VALID = """\
tiers:
  large:
    timeout_s: 30
    clusters:
      - name: large-v1
        weight: 90
        endpoints:
          - address: 127.0.0.1:50063
      - name: large-v2
        weight: 10
        endpoints:
          - address: 127.0.0.1:50064
"""


def test_default_topology_matches_default_ports() -> None:
    topology = load_topology(DEFAULT_TOPOLOGY)
    assert [t.name for t in topology.tiers] == ["small", "medium", "large"]
    ports = {t.name: t.clusters[0].endpoints[0].address for t in topology.tiers}
    assert ports == {
        "small": "127.0.0.1:50061",
        "medium": "127.0.0.1:50062",
        "large": "127.0.0.1:50063",
    }
    assert topology.control_plane == "127.0.0.1:50081"
    assert [t.listener for t in topology.tiers] == ["tier-small", "tier-medium", "tier-large"]


def test_written_topology_reads_back_the_same() -> None:
    topology = local_topology({"small": 40061, "large": 40063}, router_port=40051)
    assert parse_topology(dump_yaml(topology)) == topology
    assert topology.control_plane == "127.0.0.1:40081"


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("weight: 10", "weight: -3", ":10: tiers.large.clusters[1].weight: expected an integer"),
        ("127.0.0.1:50064", "127.0.0.1:99999", ":12: tiers.large.clusters[1].endpoints[0].address"),
        ("timeout_s: 30", "timeout: 30", ":3: tiers.large.timeout: unknown field"),
        ("  large:", "  huge:", ":2: tiers.huge: unknown field"),
        ("name: large-v2", "name: large-v1", "cluster name 'large-v1' used by tiers large and"),
        ("name: large-v2", "name: Large_V2", ":9: tiers.large.clusters[1].name:"),
        ("          - address: 127.0.0.1:50064", "          - {}", ":12: tiers.large.clusters[1]"),
        ("    timeout_s: 30", "    timeout_s: [30", "not valid YAML"),
    ],
)
def test_invalid_topology_names_line_and_field(old: str, new: str, expected: str) -> None:
    text = VALID.replace(old, new)
    assert text != VALID
    with pytest.raises(TopologyError) as raised:
        parse_topology(text, "topology.yaml")
    assert expected in str(raised.value)
    assert str(raised.value).startswith("topology.yaml:")


def test_snapshot_refuses_missing_references_and_keeps_the_previous() -> None:
    topology = parse_topology(VALID)
    cache = SnapshotCache()
    good = cache.set_snapshot("g", Snapshot.of("1", build_resources(topology)))
    broken = build_resources(topology)
    del broken[ENDPOINT]["large-v2"]
    del broken[ROUTE]["tier-large-route"]
    with pytest.raises(InconsistentSnapshot) as raised:
        cache.set_snapshot("g", Snapshot.of("2", broken))
    assert "CDS 'large-v2' needs EDS 'large-v2'" in str(raised.value)
    assert "LDS 'tier-large' needs RDS 'tier-large-route'" in str(raised.value)
    assert cache.snapshot("g") is good


def test_unchanged_types_keep_their_version() -> None:
    topology = parse_topology(VALID)
    cache = SnapshotCache()
    cache.set_snapshot("g", Snapshot.of("1", build_resources(topology)))
    moved = parse_topology(VALID.replace("127.0.0.1:50064", "127.0.0.1:50065"))
    published = cache.set_snapshot("g", Snapshot.of("2", build_resources(moved)))
    assert {t: published.version_of(t) for t in (LISTENER, ROUTE, CLUSTER, ENDPOINT)} == {
        LISTENER: "1",
        ROUTE: "1",
        CLUSTER: "1",
        ENDPOINT: "2",
    }


def test_envoy_flavour_serves_socket_listeners_with_http2_clusters() -> None:
    topology = load_topology(DEFAULT_TOPOLOGY)
    resources = build_resources(topology, ENVOY)
    listener = resources[LISTENER]["tier-large"]
    assert listener.address.socket_address.port_value == 15063
    assert not listener.HasField("api_listener")
    assert resources[CLUSTER]["large-v1"].typed_extension_protocol_options
    Snapshot.of("1", resources).check_consistent()
    proxyless = build_resources(topology, PROXYLESS)[LISTENER]["tier-large"]
    assert proxyless.HasField("api_listener")


def test_kubernetes_manifests_validate_against_the_schemas() -> None:
    topology = parse_topology(VALID)
    objects = manifests(load_topology(DEFAULT_TOPOLOGY)) + manifests(topology)
    for item in objects:
        kubernetes_validate.validate(item, "1.37.0", strict=True)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in manifests(topology)]
    assert ("Deployment", "tier-large-v2") in kinds and ("Service", "tier-large") in kinds
    assert ("Deployment", "tiermesh-control-plane") in kinds
    assert ("Deployment", "tiermesh-router") in kinds
    assert ("Deployment", "tiermesh-gateway") in kinds and ("Service", "tiermesh-gateway") in kinds
    for item in objects:
        http = item["metadata"]["name"] == "tiermesh-gateway"  # the HTTP gateway
        if item["kind"] == "Deployment":
            pod = item["spec"]["template"]["spec"]
            container = pod["containers"][0]
            assert pod["securityContext"]["runAsNonRoot"] is True
            if http:
                assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
            else:
                assert (
                    container["readinessProbe"]["grpc"]["port"]
                    == container["ports"][0]["containerPort"]
                )
            assert container["resources"]["limits"]
        if item["kind"] == "Service":
            assert item["spec"]["ports"][0]["name"] == ("http" if http else "grpc")
    config_map = next(o for o in objects if o["kind"] == "ConfigMap")
    in_cluster = parse_topology(config_map["data"]["topology.yaml"])
    assert in_cluster.tiers[0].clusters[0].endpoints[0].host.endswith(".svc.cluster.local")


def test_kubernetes_validator_rejects_a_broken_manifest() -> None:
    deployment = next(o for o in manifests(parse_topology(VALID)) if o["kind"] == "Deployment")
    deployment["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.37.0", strict=True)


def test_envoy_bootstrap_is_a_valid_envoy_bootstrap() -> None:
    data = envoy_bootstrap(load_topology(DEFAULT_TOPOLOGY))
    bootstrap = json_format.ParseDict(data, bootstrap_pb2.Bootstrap())
    assert bootstrap.dynamic_resources.lds_config.HasField("ads")
    cluster = bootstrap.static_resources.clusters[0]
    assert (
        cluster.load_assignment.endpoints[0]
        .lb_endpoints[0]
        .endpoint.address.socket_address.port_value
        == 50081
    )


def test_envoy_bootstrap_with_tls_checks_the_control_planes_certificate(tmp_path: Path) -> None:
    from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

    tls = XdsTls(tmp_path / "ca.pem", tmp_path / "envoy.pem", tmp_path / "envoy.key")
    data = envoy_bootstrap(load_topology(DEFAULT_TOPOLOGY), tls=tls)
    bootstrap = json_format.ParseDict(data, bootstrap_pb2.Bootstrap())
    socket = bootstrap.static_resources.clusters[0].transport_socket
    assert socket.name == "envoy.transport_sockets.tls"
    upstream = tls_pb2.UpstreamTlsContext()
    assert socket.typed_config.Unpack(upstream)
    context = upstream.common_tls_context
    assert context.validation_context.trusted_ca.filename == str(tmp_path / "ca.pem")
    names = {m.matcher.exact for m in context.validation_context.match_typed_subject_alt_names}
    assert names == {"127.0.0.1"}  # the topology's control plane address
    assert upstream.sni == ""  # an IP address is no SNI name
    assert context.tls_certificates[0].certificate_chain.filename == str(tmp_path / "envoy.pem")
    assert context.tls_certificates[0].private_key.filename == str(tmp_path / "envoy.key")
    plain = envoy_bootstrap(load_topology(DEFAULT_TOPOLOGY))
    assert "transport_socket" not in plain["static_resources"]["clusters"][0]


def test_cli_generators_read_one_topology(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text("control_plane: {address: 127.0.0.1:40081}\n" + VALID)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mesh", *args, "--topology", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    bootstrap = json.loads(run("bootstrap", "--node-id", "r1").stdout)
    assert bootstrap == grpc_bootstrap("127.0.0.1:40081", "r1")
    documents = list(yaml.safe_load_all(run("k8s").stdout))
    assert {d["kind"] for d in documents} >= {"Deployment", "Service", "ConfigMap"}
    assert json.loads(run("envoy").stdout)["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    path.write_text(VALID.replace("weight: 10", "weight: zero"))
    bad = run("k8s")
    assert bad.returncode == 2
    assert f"{path}:10: tiers.large.clusters[1].weight" in bad.stderr


def test_mesh_never_imports_torch_the_tiers_or_the_router() -> None:
    code = (
        "import sys, mesh.cli, mesh.control_plane, mesh.k8s, mesh.probe, mesh.admin;"
        "print([m for m in sys.modules if m == 'torch' or "
        "m.startswith(('services.tier', 'services.router'))])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("tier", "endpoints", "port"),
    [
        ("small", (Endpoint("10.0.0.5", 7000),), 7000),  # its replicas' port
        ("small", (), 50061),  # none listed (Kubernetes finds the pods): the tier's default
        ("medium", (), 50062),
        ("large", (), 50063),
    ],
)
def test_a_clusters_serving_port(tier: str, endpoints: tuple[Endpoint, ...], port: int) -> None:
    assert serving_port(tier, Cluster(f"{tier}-v1", endpoints)) == port
