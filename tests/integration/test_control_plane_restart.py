"""The control plane and the router across restarts, with real processes: a control plane
restarted after its topology file turned invalid still serves the last good topology to
grpcio's real xDS client (`python -m mesh probe` in a child process), and a router started while
the control plane is down reports NOT_SERVING until it has its xDS resources, then SERVING.
Backends are real gRPC servers on port 0 that answer GetStatus with their own name."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mesh.admin import fetch_status
from mesh.bootstrap import bootstrap_env
from mesh.last_good import last_good_path
from services.common.child_process import Child
from services.common.ports import free_port
from services.common.tiers import TIER_NAMES
from tests.integration.processes import spawn, wait_serving, write_toml
from tests.integration.test_mesh_xds import (
    TARGET,
    Backend,
    run_mesh_cli,
    start_backend,
    topology_text,
)

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    started = await start_backend("a")
    yield started
    await started.server.stop(0)


@pytest.fixture
def services() -> Iterator[list[Child]]:
    """Every process a test starts; all stopped (SIGKILL if need be) however the test ends."""
    started: list[Child] = []
    yield started
    for service in started:
        service.stop()


async def probe_counts(control_plane: str, calls: int, node_id: str) -> dict[str, int]:
    """What a fresh xDS client (a child process) is answered by on TARGET."""
    code, out, err = await run_mesh_cli(
        "probe", TARGET, "--calls", str(calls), env=bootstrap_env(control_plane, node_id)
    )
    assert code == 0, err
    counts: dict[str, int] = json.loads(out)["counts"]
    return counts


def serve_topology(path: Path, port: int, log_dir: Path, name: str) -> Child:
    args = ["serve", "--topology", str(path), "--host", "127.0.0.1", "--port", str(port)]
    return spawn(name, "mesh", args, f"127.0.0.1:{port}", log_dir)


async def test_restarted_control_plane_serves_the_last_good_topology(
    tmp_path: Path, backend: Backend, services: list[Child]
) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(topology_text([("large-v1", 1, [backend.port])]))
    port = free_port()
    plane = serve_topology(path, port, tmp_path, "control-plane")
    services.append(plane)
    await wait_serving(plane, 60)
    assert await probe_counts(plane.address, 3, "before") == {"a": 3}
    assert last_good_path(path).is_file()

    path.write_text(topology_text([("large-v1", "heavy", [backend.port])]))  # type: ignore[list-item]
    status = await _wait_for_status(plane.address, lambda s: "weight" in s.last_reload_error)
    assert status.topology_version == "1"
    plane.signal(signal.SIGKILL)
    plane.process.wait(10)

    restarted = serve_topology(path, port, tmp_path, "control-plane-restarted")
    services.append(restarted)
    await wait_serving(restarted, 60)
    assert await probe_counts(restarted.address, 3, "after") == {"a": 3}
    status = await _wait_for_status(restarted.address, lambda s: bool(s.last_reload_error))
    assert "weight" in status.last_reload_error
    assert "serving the last good topology" in status.last_reload_error
    assert "refused at start" in restarted.log_path.read_text()


async def _wait_for_status(address: str, test, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = await asyncio.to_thread(fetch_status, address)
        if test(status):
            return status
        assert asyncio.get_running_loop().time() < deadline, status
        await asyncio.sleep(0.1)


async def _router_health(address: str) -> int | None:
    """The router's overall health status, or None while it does not answer."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.aio.AioRpcError:
            return None
        return int(response.status)


async def test_router_is_not_serving_until_the_control_plane_gives_it_the_tiers(
    tmp_path: Path, backend: Backend, services: list[Child], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = ["tiers:"]
    for tier in TIER_NAMES:
        lines += [
            f"  {tier}:",
            "    clusters:",
            f"      - name: {tier}-v1",
            "        endpoints:",
            f"          - address: 127.0.0.1:{backend.port}",
        ]
    path = tmp_path / "topology.yaml"
    path.write_text("\n".join(lines) + "\n")
    plane_port, router_port = free_port(), free_port()
    tiers = {tier: f"xds:///tier-{tier}" for tier in TIER_NAMES}
    values = {"port": router_port, "metrics_port": 0}
    config = write_toml(tmp_path / "router.toml", values, {"tiers": tiers})
    for name, value in bootstrap_env(f"127.0.0.1:{plane_port}", "router-test").items():
        monkeypatch.setenv(name, value)
    router = spawn(
        "router", "services.router", ["--config", str(config)], f"127.0.0.1:{router_port}", tmp_path
    )
    services.append(router)

    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    deadline = asyncio.get_running_loop().time() + 60
    while (status := await _router_health(router.address)) is None:
        assert router.process.poll() is None, router.log_tail()
        assert asyncio.get_running_loop().time() < deadline, router.log_tail()
        await asyncio.sleep(0.1)
    assert status == not_serving
    await asyncio.sleep(1.0)  # the control plane is still down: still NOT_SERVING
    assert await _router_health(router.address) == not_serving
    assert "NOT_SERVING until it has its xDS resources" in router.log_path.read_text()

    monkeypatch.delenv("GRPC_XDS_BOOTSTRAP_CONFIG", raising=False)
    plane = serve_topology(path, plane_port, tmp_path, "control-plane")
    services.append(plane)
    await wait_serving(plane, 60)
    await wait_serving(router, 60)
    assert "xDS resources for every tier: router SERVING" in router.log_path.read_text()
