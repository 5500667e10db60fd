"""Starts a real mesh in-process for tests: three torch tiers and a router, all on port 0."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from tiermesh.client import AsyncRouterClient, DeltaEvent, FinalEvent
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import RouterConfig, TierConfig
from services.common.config_loading import build_config
from services.common.ports import free_port
from services.common.tiers import TIER_NAMES
from services.router.server import RouterServer, start_router
from services.tier.server import TierServer, start_tier


@dataclass
class Mesh:
    tiers: dict[str, TierServer]
    router: RouterServer
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.router.address

    async def tier_status(self, tier: str) -> tier_pb2.TierStatus:
        channel = grpc.aio.insecure_channel(self.tiers[tier].address)
        self.channels.append(channel)
        return await tier_pb2_grpc.TierServiceStub(channel).GetStatus(tier_pb2.GetStatusRequest())

    async def wait_idle(self, tier: str, timeout_s: float = 10.0) -> tier_pb2.TierStatus:
        """Polls the tier until nothing runs or waits on it; returns that status."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            status = await self.tier_status(tier)
            if status.running == 0 and status.queued == 0:
                return status
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"tier {tier} still busy: {status}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        for channel in self.channels:
            await channel.close()
        await self.router.stop(0)
        for tier in self.tiers.values():
            await tier.stop(0)


async def start_mesh(
    model_dir: Path,
    *,
    tiers: tuple[str, ...] = TIER_NAMES,
    down: tuple[str, ...] = (),
    models: dict[str, Path] | None = None,
    tier_options: dict[str, Any] | None = None,
    router_options: dict[str, Any] | None = None,
) -> Mesh:
    """Tiers in `tiers` run on `model_dir` (or on `models[tier]`); tiers in `down` point the
    router at a port nothing listens on."""
    servers: dict[str, TierServer] = {}
    for name in tiers:
        path = (models or {}).get(name, model_dir)
        options = {"name": name, "model_path": str(path), **(tier_options or {})}
        servers[name] = await start_tier(build_config(TierConfig, options))
    targets = {name: server.address for name, server in servers.items()}
    for name in down:
        targets[name] = f"127.0.0.1:{free_port()}"  # nothing listens there
    router_config = build_config(
        RouterConfig, {"port": 0, "tiers": targets, **(router_options or {})}
    )
    router = await start_router(router_config)
    return Mesh(servers, router)


async def hold_stream(
    client: AsyncRouterClient, ready: asyncio.Event, prompt: str, **options: Any
) -> FinalEvent | None:
    """Reads one chat to its end, setting `ready` at its first delta; returns its Final."""
    async for event in client.chat_stream(prompt, **options):
        if isinstance(event, DeltaEvent):
            ready.set()
        if isinstance(event, FinalEvent):
            return event
    return None


async def leave_after_first_delta(client: AsyncRouterClient, prompt: str, **options: Any) -> None:
    """Starts a chat and leaves (cancels it) as soon as its first delta arrives."""
    stream = client.chat_stream(prompt, **options)
    async for event in stream:
        if isinstance(event, DeltaEvent):
            break
    await stream.aclose()
