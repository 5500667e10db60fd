"""End to end with the mesh: `tiermesh run --mesh` starts the control plane beside the tiers and
the router, the router reaches the tiers through xds:/// targets, a chat works, and
`tiermesh mesh status` shows the router's node with every resource type ACKed; a tier's
replicas (`--replicas medium=2`) are endpoints of its cluster and xDS spreads chats over both."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from tiermesh.client import FinalEvent, RouteEvent, RouterClient
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.launcher.local_mesh import free_base_port
from tests.e2e.run_process import ROOT, TIERMESH, chat_json, tiermesh_run


@pytest.fixture
def mesh_process(tiny_model_dir: Path, tmp_path: Path):
    base = free_base_port()
    models = [
        arg
        for tier in ("small", "medium", "large")
        for arg in ("--model", f"{tier}={tiny_model_dir}")
    ]
    env = {"TIERMESH_RUN_DIR": str(tmp_path / "run")}
    args = ["--mesh", "--replicas", "medium=2", "--base-port", str(base), *models]
    with tiermesh_run(args, env) as (process, output):
        yield process, base, tmp_path / "run", output


def _completed(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return int(stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5).completed)


def test_run_mesh_routes_through_xds(mesh_process) -> None:
    process, base, run_dir, output = mesh_process
    assert "control-plane" in "".join(output)
    topology = (run_dir / "logs" / "topology.yaml").read_text()
    assert f"127.0.0.1:{base + 12}" in topology and f"127.0.0.1:{base + 30}" in topology

    args = ["--max-tokens", "8", "--mode", "progressive", "--progressive-gate", "always"]
    args.append("Where is my order?")
    events = chat_json(f"127.0.0.1:{base}", *args)
    assert events[-1]["type"] == "final" and events[-1]["tier"] == "large"

    status = subprocess.run(
        [*TIERMESH, "mesh", "status", "--json", "--address", f"127.0.0.1:{base + 30}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    nodes = {node["node_id"]: node for node in json.loads(status.stdout)["nodes"]}
    router = nodes[f"router~{base}"]
    types = {t["type"]: t for t in router["types"]}
    assert {name: t["state"] for name, t in types.items()} == {
        "LDS": "ACKED",
        "RDS": "ACKED",
        "CDS": "ACKED",
        "EDS": "ACKED",
    }
    assert set(types["LDS"]["resource_names"]) >= {"tier-small", "tier-large"}

    # medium's two replicas: both in its cluster, both answer pinned chats (xDS round robin).
    (medium_cluster,) = [c for c in json.loads(status.stdout)["clusters"] if c["tier"] == "medium"]
    replicas = [e["address"] for e in medium_cluster["endpoints"]]
    assert len(replicas) == 2 and f"127.0.0.1:{base + 11}" in replicas
    with RouterClient(f"127.0.0.1:{base}") as client:
        for _ in range(8):
            answer = client.chat("Hi", mode="pinned", tier="medium", max_tokens=2)
            assert answer.tier == "medium"
    assert all(_completed(replica) > 0 for replica in replicas), replicas

    # Editing the topology moves traffic without dropping a stream already in flight.
    router_address, small, medium = (f"127.0.0.1:{base + o}" for o in (0, 10, 11))
    with RouterClient(router_address) as client:
        stream = client.chat_stream("Hi", mode="pinned", tier="small", max_tokens=200)
        assert isinstance(next(stream), RouteEvent)
        path = run_dir / "logs" / "topology.yaml"
        path.write_text(path.read_text().replace(small, medium))
        edited = time.monotonic()
        events = list(stream)
        final = events[-1]
        assert isinstance(final, FinalEvent) and final.tier == "small"
        assert final.usage[0]["completion_tokens"] > 0
        before = _completed(medium)
        while _completed(medium) == before:
            assert time.monotonic() - edited < 10, "traffic did not move to the new endpoint"
            client.chat("Hi", mode="pinned", tier="small", max_tokens=2)
        moved_s = time.monotonic() - edited
    print(f"topology edit -> traffic on the new endpoint: {moved_s * 1000:.0f} ms")

    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, rest
