"""A chat sent while the tiers are still loading their models, through a real router and a real
torch tier whose start is held: the router waits (within the chat's deadline and its
loading_wait_s) for the tier to serve instead of failing at once; with no wait allowed it
fails UNAVAILABLE as before."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, ChatError

from services.common.config import RouterConfig, TierConfig
from services.common.config_loading import build_config
from services.common.ports import free_port
from services.router.server import RouterServer, start_router
from services.tier.server import TierServer, start_tier
from services.tier.torch_engine import TorchEngine

HELD_S = 1.5  # how long the tier's model load is held


class HeldTorchEngine(TorchEngine):
    """The real torch engine, whose start (the model load) waits until `release` is set."""

    def __init__(self, config: TierConfig, release: asyncio.Event) -> None:
        super().__init__(config)
        self._release = release

    async def start(self) -> None:
        await self._release.wait()
        await super().start()


async def start_loading_tier(model: Path) -> tuple[asyncio.Task[TierServer], asyncio.Event, str]:
    """A tier serving NOT_SERVING (loading) until the returned event is set."""
    port = free_port()
    config = build_config(
        TierConfig, {"name": "small", "model_path": str(model), "port": port, "metrics_port": 0}
    )
    release = asyncio.Event()
    task = asyncio.create_task(start_tier(config, engine=HeldTorchEngine(config, release)))
    return task, release, f"127.0.0.1:{port}"


@pytest.mark.parametrize("wait_s", [30.0, 0.0])
async def test_a_chat_waits_for_a_loading_tier(tiny_model_dir: Path, wait_s: float) -> None:
    loading, release, address = await start_loading_tier(tiny_model_dir)
    tiers = {"small": address, "large": address}  # draft and refine: the one loading tier
    options = {"port": 0, "tiers": tiers, "loading_wait_s": wait_s, "fallback": {}}
    router: RouterServer | None = None
    tier: TierServer | None = None
    try:
        router = await start_router(build_config(RouterConfig, options))
        await asyncio.sleep(0.5)  # the router has seen the tier loading
        asyncio.get_running_loop().call_later(HELD_S, release.set)
        started = time.monotonic()
        async with AsyncRouterClient(router.address) as client:
            if wait_s:
                result = await client.chat("Hello?", mode="pinned", tier="small", timeout=20)
                assert result.tier == "small" and result.final.reason == "answered by small"
                assert time.monotonic() - started >= HELD_S - 0.6  # it waited for the load
            else:
                with pytest.raises(ChatError) as failed:
                    await client.chat("Hello?", mode="pinned", tier="small", timeout=20)
                assert failed.value.code == "UNAVAILABLE"
                assert time.monotonic() - started < HELD_S - 0.6  # at once, as before
        release.set()
        tier = await loading
    finally:
        release.set()
        if router is not None:
            await router.stop(0)
        tier = tier or await loading
        await tier.stop(0)


async def test_a_chat_waits_for_a_tier_process_that_is_not_up_yet(tiny_model_dir: Path) -> None:
    """The router starts before its tier listens (a tier process still importing its model
    code): a chat sent then is answered once the tier comes up, not refused at once."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    options = {"port": 0, "tiers": {"small": address, "large": address}, "fallback": {}}
    router = await start_router(build_config(RouterConfig, options))
    tier: TierServer | None = None
    try:
        config = build_config(
            TierConfig,
            {"name": "small", "model_path": str(tiny_model_dir), "port": port, "metrics_port": 0},
        )
        started = time.monotonic()
        async with AsyncRouterClient(router.address) as client:
            chat = asyncio.create_task(
                client.chat("Hello?", mode="pinned", tier="small", timeout=30)
            )
            await asyncio.sleep(HELD_S)
            assert not chat.done()  # waiting for the tier, not refused
            tier = await start_tier(config)
            result = await chat
        assert result.tier == "small" and result.final.reason == "answered by small"
        assert time.monotonic() - started >= HELD_S
    finally:
        await router.stop(0)
        if tier is not None:
            await tier.stop(0)
