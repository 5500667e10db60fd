"""End to end with the mesh: `tiermesh run --mesh` starts the control plane beside the tiers and
the router, the router reaches the tiers through xds:/// targets, a chat works, and
`tiermesh mesh status` shows the router's node with every resource type ACKed."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from services.router.launcher import free_base_port
from tests.e2e.run_process import ROOT, TIERMESH, tiermesh_run


@pytest.fixture
def mesh_process(tiny_model_dir: Path, tmp_path: Path):
    base = free_base_port()
    models = [
        arg
        for tier in ("small", "medium", "large")
        for arg in ("--model", f"{tier}={tiny_model_dir}")
    ]
    env = {"TIERMESH_RUN_DIR": str(tmp_path / "run")}
    with tiermesh_run(["--mesh", "--base-port", str(base), *models], env) as (process, output):
        yield process, base, tmp_path / "run", output


def test_run_mesh_routes_through_xds(mesh_process) -> None:
    process, base, run_dir, output = mesh_process
    assert "control-plane" in "".join(output)
    topology = (run_dir / "logs" / "topology.yaml").read_text()
    assert f"127.0.0.1:{base + 12}" in topology and f"127.0.0.1:{base + 30}" in topology

    chat = subprocess.run(
        [*TIERMESH, "chat", "--router", f"127.0.0.1:{base}", "--json", "--max-tokens", "8"]
        + ["--mode", "progressive", "Where is my order?"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert chat.returncode == 0, chat.stdout + chat.stderr
    events = [json.loads(line) for line in chat.stdout.splitlines()]
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

    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, rest
