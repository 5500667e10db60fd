"""End to end with the mesh: `tiermesh run --mesh` starts the control plane beside the tiers and
the router, the router reaches the tiers through xds:/// targets, a chat works, and
`tiermesh mesh status` shows the router's node with every resource type ACKed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIERMESH = [sys.executable, "-m", "services.router.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _free_base_port() -> int:
    """A base port B with B, B+10..12 (tiers), B+20..23 (metrics) and B+30 (the control plane)
    free."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + 30 > 65535:
            continue
        try:
            for port in (*range(base + 10, base + 13), *range(base + 20, base + 24), base + 30):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port layout found")


@pytest.fixture
def mesh_process(tiny_model_dir: Path, tmp_path: Path):
    base = _free_base_port()
    env = {**os.environ, "TIERMESH_RUN_DIR": str(tmp_path / "run")}
    models = [
        arg
        for tier in ("small", "medium", "large")
        for arg in ("--model", f"{tier}={tiny_model_dir}")
    ]
    command = [*TIERMESH, "run", "--mesh", "--no-demo", "--base-port", str(base), *models]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output: list[str] = []
    deadline = time.monotonic() + 120
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if "serving; Ctrl-C" in line:
            break
    assert process.poll() is None, "".join(output)
    yield process, base, tmp_path / "run", output
    if process.poll() is None:  # the test failed midway: stop the mesh the normal way first
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


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
