"""The gateway's /health reports the tiers behind the router as the router publishes them
(gRPC health `tiermesh.tier.<name>`): 200 "ok" with every tier up, 200 "degraded" while some
tier is down (the mesh still answers on the others), 503 "unavailable" once no tier can take a
call; a tier whose port closes is seen down."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tiers import tier_health_name
from tests.integration.gateway_mesh import GatewayMesh


@pytest.fixture
def gateway(tiny_model_dir: Path) -> Iterator[GatewayMesh]:
    mesh = GatewayMesh.start(
        tiny_model_dir,
        tiers=("small",),
        down=("medium",),
        router_options={"refine_tier": "medium"},
    )
    yield mesh
    mesh.stop()


def _health_until(url: str, status: str, timeout_s: float = 15.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{url}/health", timeout=5)
        if response.json()["status"] == status or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def test_router_publishes_each_tier_health(gateway: GatewayMesh) -> None:
    assert gateway.mesh is not None
    _health_until(gateway.url, "degraded")
    statuses: dict[str, Any] = {}
    with grpc.insecure_channel(gateway.mesh.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for tier in ("small", "medium"):
            request = health_pb2.HealthCheckRequest(service=tier_health_name(tier))
            statuses[tier] = stub.Check(request, timeout=5).status
        with pytest.raises(grpc.RpcError) as missing:  # not a tier of this router
            stub.Check(health_pb2.HealthCheckRequest(service=tier_health_name("large")), timeout=5)
    assert statuses == {
        "small": health_pb2.HealthCheckResponse.SERVING,
        "medium": health_pb2.HealthCheckResponse.NOT_SERVING,
    }
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_degraded_then_unavailable_when_the_last_tier_goes(gateway: GatewayMesh) -> None:
    assert gateway.mesh is not None
    degraded = _health_until(gateway.url, "degraded")
    assert degraded.status_code == 200
    assert degraded.json() == {
        "status": "degraded",
        "router": gateway.mesh.address,
        "router_status": "SERVING",
        "tiers": {"small": "SERVING", "medium": "NOT_SERVING"},
    }
    body = {"model": "tiermesh-routed", "messages": [{"role": "user", "content": "Hi"}]}
    answered = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
    assert answered.status_code == 200  # degraded still answers
    small = gateway.mesh.tiers.pop("small")
    gateway.run(small.stop(0))  # its port closes
    gone = _health_until(gateway.url, "unavailable")
    assert gone.status_code == 503
    assert gone.json()["tiers"] == {"small": "NOT_SERVING", "medium": "NOT_SERVING"}
    assert gone.json()["router_status"] == "SERVING"
