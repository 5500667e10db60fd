"""The control plane against grpcio's real xDS client. Backends are real gRPC servers on port 0
that answer TierService.GetStatus with their own name; the client is `python -m mesh probe` in a
child process (grpc's xDS client reads its bootstrap once per process), calling
`xds:///tier-large` and reporting which backend answered.

Measured here (printed with `pytest -s`): time from a topology file edit to the first call
served by the new endpoint, and the weighted split.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from mesh.bootstrap import bootstrap_env
from mesh.control_plane import RunningControlPlane, start_control_plane
from mesh.node_status import ACKED, NACKED

ROOT = Path(__file__).resolve().parents[2]
TARGET = "xds:///tier-large"


class NamedTier(tier_pb2_grpc.TierServiceServicer):
    """A backend that only says who it is (the model field of GetStatus)."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def GetStatus(self, request, context):
        return tier_pb2.TierStatus(tier="large", model=self.name)


@dataclass
class Backend:
    name: str
    server: grpc.aio.Server
    port: int


async def start_backend(name: str) -> Backend:
    server = grpc.aio.server()
    tier_pb2_grpc.add_TierServiceServicer_to_server(NamedTier(name), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Backend(name, server, port)


@pytest.fixture
async def backends() -> AsyncIterator[dict[str, Backend]]:
    started = {name: await start_backend(name) for name in ("a", "b", "c")}
    yield started
    for backend in started.values():
        await backend.server.stop(0)


def topology_text(clusters: list[tuple[str, int, list[int]]]) -> str:
    """A topology with the large tier only: (cluster name, weight, endpoint ports)."""
    lines = ["tiers:", "  large:", "    clusters:"]
    for name, weight, ports in clusters:
        lines += [
            f"      - name: {name}",
            f"        weight: {weight}",
            "        endpoints:",
        ]
        lines += [f"          - address: 127.0.0.1:{port}" for port in ports]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> float:
    """Replaces the file in one step; returns when (time.time()) the new file was in place."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return time.time()


async def run_mesh_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesh",
        *args,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def probe_counts(plane: RunningControlPlane, calls: int, node_id: str) -> dict[str, int]:
    code, out, err = await run_mesh_cli(
        "probe", TARGET, "--calls", str(calls), env=bootstrap_env(plane.address, node_id)
    )
    assert code == 0, err
    counts: dict[str, int] = json.loads(out)["counts"]
    return counts


@dataclass
class Follower:
    """`mesh probe --follow` in a child process; its JSON lines collected as they come."""

    process: asyncio.subprocess.Process
    lines: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            self.lines.append(json.loads(raw))

    async def wait_for(
        self, test: Callable[[dict[str, Any]], bool], timeout_s: float = 10.0, after: float = 0.0
    ) -> dict[str, Any]:
        """The first line (ending after `after`) for which `test` holds."""
        deadline = time.monotonic() + timeout_s
        checked = 0
        while time.monotonic() < deadline:
            for line in self.lines[checked:]:
                if line["t"] > after and test(line):
                    return line
            checked = len(self.lines)
            await asyncio.sleep(0.02)
        raise AssertionError(f"not seen within {timeout_s} s; last lines {self.lines[-3:]}")

    def since(self, after: float) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["t"] > after]


@pytest.fixture
async def follow() -> AsyncIterator[Callable[[RunningControlPlane, str], Any]]:
    followers: list[Follower] = []

    async def start(plane: RunningControlPlane, node_id: str) -> Follower:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "mesh", "probe", TARGET, "--follow", "60"),
            cwd=ROOT,
            env={**os.environ, **bootstrap_env(plane.address, node_id)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        follower = Follower(process)
        follower.reader = asyncio.create_task(follower._read())
        followers.append(follower)
        return follower

    yield start
    for follower in followers:
        if follower.process.returncode is None:
            follower.process.kill()
        await follower.process.wait()
        if follower.reader is not None:
            follower.reader.cancel()


@pytest.fixture
async def planes() -> AsyncIterator[list[RunningControlPlane]]:
    started: list[RunningControlPlane] = []
    yield started
    for plane in started:
        await plane.stop()


def only(*names: str) -> Callable[[dict[str, Any]], bool]:
    """A window in which exactly these backends answered (and nothing failed)."""
    return lambda line: set(line["counts"]) == set(names)


def answered_by(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda line: name in line["first"]


async def test_endpoints_move_and_traffic_follows(backends, planes, follow, tmp_path) -> None:
    a, b = backends["a"], backends["b"]
    path = tmp_path / "topology.yaml"
    path.write_text(topology_text([("large-v1", 1, [a.port])]))
    plane = await start_control_plane(path)
    planes.append(plane)
    follower = await follow(plane, "mover")
    await follower.wait_for(only("a"))
    moved_ms = []
    for target in (b, a, b, a, b):
        edited = write_atomically(path, topology_text([("large-v1", 1, [target.port])]))
        first = await follower.wait_for(answered_by(target.name), after=edited)
        moved_ms.append((first["first"][target.name] - edited) * 1000)
        await follower.wait_for(only(target.name), after=edited)
    print(
        f"\nfile edit -> first call on the new endpoint: p50 {statistics.median(moved_ms):.0f} ms, "
        f"max {max(moved_ms):.0f} ms over {len(moved_ms)} moves (poll 200 ms)"
    )
    assert max(moved_ms) < 2000
    record = plane.plane.book.node("mover").types
    assert all(r.state == ACKED for r in record.values())


async def test_weighted_split_80_20(backends, planes) -> None:
    a, b = backends["a"], backends["b"]
    plane = await start_control_plane(
        None, topology=_parse([("large-v1", 80, [a.port]), ("large-v2", 20, [b.port])])
    )
    planes.append(plane)
    counts = await probe_counts(plane, 1000, "splitter")
    share = counts.get("a", 0) / sum(counts.values())
    print(f"\nweighted split 80/20 over {sum(counts.values())} calls: {counts} ({share:.1%} on a)")
    assert sum(counts.values()) == 1000 and set(counts) == {"a", "b"}
    assert 0.75 <= share <= 0.85


async def test_new_replica_receives_traffic(backends, planes, follow, tmp_path) -> None:
    a, c = backends["a"], backends["c"]
    path = tmp_path / "topology.yaml"
    path.write_text(topology_text([("large-v1", 1, [a.port])]))
    plane = await start_control_plane(path, poll_interval_s=0.05)
    planes.append(plane)
    follower = await follow(plane, "scaler")
    await follower.wait_for(only("a"))
    edited = write_atomically(path, topology_text([("large-v1", 1, [a.port, c.port])]))
    await follower.wait_for(lambda line: "c" in line["counts"], after=edited)
    later = await follower.wait_for(lambda line: line["t"] > edited + 0.3)
    spread = await follower.wait_for(only("a", "c"), after=later["t"])
    assert spread["counts"]["c"] >= 1


async def test_invalid_topology_is_refused_and_nothing_changes(
    backends, planes, follow, tmp_path
) -> None:
    a, b = backends["a"], backends["b"]
    path = tmp_path / "topology.yaml"
    path.write_text(topology_text([("large-v1", 1, [a.port])]))
    plane = await start_control_plane(path, poll_interval_s=0.05)
    planes.append(plane)
    follower = await follow(plane, "steady")
    await follower.wait_for(only("a"))
    bad = topology_text([("large-v1", 1, [b.port])]).replace("weight: 1", "weight: heavy")
    edited = write_atomically(path, bad)
    deadline = time.monotonic() + 5
    while not plane.plane.last_error and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert (
        f"{path}:5: tiers.large.clusters[0].weight: expected an integer" in plane.plane.last_error
    )
    assert plane.plane.version == 1
    await asyncio.sleep(0.5)
    assert all(set(line["counts"]) == {"a"} for line in follower.since(edited))
    code, out, _ = await run_mesh_cli("status", "--address", plane.address)
    assert code == 0 and "last reload REFUSED" in out and "weight: expected an integer" in out

    fixed = write_atomically(path, topology_text([("large-v1", 1, [b.port])]))
    await follower.wait_for(only("b"), after=fixed)
    assert plane.plane.version == 2 and plane.plane.last_error == ""


async def test_control_plane_restart_clients_keep_serving_and_resync(
    backends, planes, follow, tmp_path
) -> None:
    a, b = backends["a"], backends["b"]
    path = tmp_path / "topology.yaml"
    path.write_text(topology_text([("large-v1", 1, [a.port])]))
    plane = await start_control_plane(path)
    follower = await follow(plane, "survivor")
    await follower.wait_for(only("a"))
    port = plane.port
    await plane.stop()
    stopped = time.time()
    await asyncio.sleep(1.0)
    during = follower.since(stopped)
    assert during and all(set(line["counts"]) == {"a"} for line in during), during[-3:]

    path.write_text(topology_text([("large-v1", 1, [b.port])]))
    restarted = await start_control_plane(path, port=port)
    planes.append(restarted)
    started = time.time()
    resynced = await follower.wait_for(only("b"), after=started, timeout_s=30)
    print(
        f"\ncontrol plane restarted: client on the new config after {resynced['t'] - started:.2f} s"
    )
    node = restarted.plane.book.node("survivor")
    assert node is not None and node.streams == 1
    assert all(record.state == ACKED for record in node.types.values())


async def test_nacked_resource_is_reported_by_mesh_status(backends, planes) -> None:
    a, b = backends["a"], backends["b"]
    topology = _parse([("large-v1", 80, [a.port]), ("large-v2", 20, [b.port])], lb="least_request")
    plane = await start_control_plane(None, topology=topology)
    planes.append(plane)
    counts = await probe_counts(plane, 50, "refuser")
    assert counts.get("error:UNAVAILABLE", 0) + counts.get("a", 0) == 50

    code, out, _ = await run_mesh_cli("status", "--address", plane.address, "--json")
    assert code == 0
    status = json.loads(out)
    node = next(n for n in status["nodes"] if n["node_id"] == "refuser")
    types = {t["type"]: t for t in node["types"]}
    assert types["CDS"]["state"] == NACKED and types["CDS"]["nacked_version"] == "1"
    assert "large-v2" in types["CDS"]["nack_detail"] and "lb_policy" in types["CDS"]["nack_detail"]
    per_resource = {r["name"]: r["state"] for r in types["CDS"]["resources"]}
    assert per_resource == {"large-v1": ACKED, "large-v2": NACKED}
    assert types["LDS"]["state"] == ACKED
    endpoints = {c["cluster"]: c["endpoints"][0]["address"] for c in status["clusters"]}
    assert endpoints == {"large-v1": f"127.0.0.1:{a.port}", "large-v2": f"127.0.0.1:{b.port}"}
    code, text, _ = await run_mesh_cli("status", "--address", plane.address)
    assert "CDS NACKED" in text and "large-v2 NACKed v1: " in text


def _parse(clusters: list[tuple[str, int, list[int]]], lb: str = "") -> Any:
    from mesh.topology_file import parse_topology

    text = topology_text(clusters)
    if lb:  # only the last cluster gets the policy
        head, sep, tail = text.rpartition("        endpoints:")
        text = head + f"        lb_policy: {lb}\n" + sep + tail
    return parse_topology(text)
