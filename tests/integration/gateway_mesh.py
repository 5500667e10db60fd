"""A real mesh (torch tiers + router, port 0) and the HTTP gateway (uvicorn, port 0) running in
an event loop on a background thread, so tests can use blocking clients (openai, httpx,
Playwright) against it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import GatewayConfig
from services.common.config_loading import build_config
from services.gateway.server import RunningGateway, start_gateway
from tests.integration.mesh import Mesh, start_mesh
from tests.tiny_model import build_tiny_model

T = TypeVar("T")


class GatewayMesh:
    """Start with `GatewayMesh.start(...)`, stop with `stop()`; `url` is the gateway's base URL."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.mesh: Mesh | None = None
        self.gateway: RunningGateway | None = None
        self.extra_gateways: list[RunningGateway] = []  # more gateways tests started, stopped too

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    @classmethod
    def start(cls, model_dir: Path, **mesh_options: Any) -> GatewayMesh:
        self = cls()
        self.mesh = self.run(start_mesh(model_dir, **mesh_options))
        config = build_config(GatewayConfig, {"port": 0, "router": self.mesh.address})
        self.gateway = self.run(start_gateway(config))
        return self

    def extra_gateway(self, router: str | None = None, **options: Any) -> str:
        """Starts another gateway with these config options, on `router` (default: this mesh's
        router); returns its base URL. Stopped with the mesh."""
        assert self.mesh is not None
        target = self.mesh.address if router is None else router
        config = build_config(GatewayConfig, {"port": 0, "router": target, **options})
        running = self.run(start_gateway(config))
        self.extra_gateways.append(running)
        return running.url

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def tier_status(self, tier: str) -> tier_pb2.TierStatus:
        assert self.mesh is not None
        with grpc.insecure_channel(self.mesh.tiers[tier].address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            return stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5)

    def wait_idle(self, tier: str, timeout_s: float = 10.0) -> tier_pb2.TierStatus:
        assert self.mesh is not None
        return self.run(self.mesh.wait_idle(tier, timeout_s), timeout_s + 5)

    def stop(self) -> None:
        try:
            for gateway in self.extra_gateways:
                self.run(gateway.stop())
            if self.gateway is not None:
                self.run(self.gateway.stop())
            if self.mesh is not None:
                self.run(self.mesh.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


LONG = {"max_tokens": 400}  # room for streams that tests leave while they still run


def module_gateway(tmp_path: Path, model_dir: Path) -> Iterator[GatewayMesh]:
    """Body of a module-scoped fixture: the mesh and gateway, with the large tier on other
    weights than the small one so that a refinement visibly replaces the draft (progressive gate
    `always`: every progressive chat is a draft and its refinement)."""
    other = build_tiny_model(tmp_path, seed=7)
    router = {**LONG, "progressive_gate": "always"}
    mesh = GatewayMesh.start(
        model_dir, models={"large": other}, tier_options=LONG, router_options=router
    )
    yield mesh
    mesh.stop()
