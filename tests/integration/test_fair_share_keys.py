"""Fair shares between two real API keys at a real router (TLS, keys file) over echo tiers:
while the large and medium tiers are full, a routed chat of the key holding more than its part
of the chats in flight is refused at once (RESOURCE_EXHAUSTED, FAIR_SHARE) though the small tier
has room, and the other key's chat steps down onto that room and is answered; a key alone has
the whole mesh and steps down too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient, ChatError, RouteEvent, tls_credentials

from services.common.config import RouterConfig, TierConfig
from services.common.config_loading import build_config
from services.router.server import RouterServer, start_router
from services.security.api_keys import create_key
from services.security.certs import init_ca, issue
from services.security.settings import ServiceSecurity
from services.security.tls import TlsFiles
from services.tier.server import TierServer, start_tier

# the router's default policy sends this to large (complexity over 0.7)
COMPLEX = (
    "Please price an order of 2 navy bottles, 4 pink spoons and 3 green bowls. "
    "I have coupon SAVE10. How much will I pay in total?"
)
ECHO = {"engine": "echo", "echo_ttft_ms": 1.0, "echo_tokens_per_s": 20.0, "max_queued": 0}
SLOTS = {"small": 2, "medium": 4, "large": 5}
ROUTER_ID = "spiffe://tiermesh/router"


def _files(pki: Path, stem: str) -> TlsFiles:
    return TlsFiles(pki / "ca.pem", pki / f"{stem}.pem", pki / f"{stem}-key.pem")


@dataclass
class KeyedMesh:
    router: RouterServer
    tiers: dict[str, TierServer]
    pki: Path
    hog: str
    calm: str

    def client(self, key: str) -> AsyncRouterClient:
        credentials = tls_credentials(self.pki / "ca.pem")
        address = f"localhost:{self.router.port}"
        return AsyncRouterClient(address, credentials=credentials, api_key=key)

    async def until_full(self, tier: str) -> None:
        """Until the router's load report of `tier` says it is full."""
        loads = self.router.watcher.loads
        for _ in range(250):
            load = loads[tier]
            if load is not None and load.queue_full:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{tier} never reported full: {loads[tier]}")


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[KeyedMesh]:
    pki = tmp_path / "certs"
    init_ca(pki)
    for name in ("router", *(f"tier/{tier}" for tier in SLOTS)):
        issue(pki, name)
    keys = tmp_path / "keys.json"
    _, hog = create_key(keys, "hog", ("chat",))
    _, calm = create_key(keys, "calm", ("chat",))
    tiers = {
        name: await start_tier(
            build_config(
                TierConfig,
                {"name": name, "model_path": "unused", **ECHO, "max_running": slots},
            ),
            ServiceSecurity(_files(pki, f"tier-{name}"), allowed_callers=(ROUTER_ID,)),
        )
        for name, slots in SLOTS.items()
    }
    security = ServiceSecurity(_files(pki, "router"), client_auth="optional", keys_file=keys)
    options = {
        "port": 0,
        "tiers": {name: f"localhost:{tier.port}" for name, tier in tiers.items()},
        "load_watch_interval_ms": 50,
    }
    router = await start_router(build_config(RouterConfig, options), security)
    try:
        yield KeyedMesh(router, tiers, pki, hog, calm)
    finally:
        await router.stop(0)
        for tier in tiers.values():
            await tier.stop(0)


async def _hold(client: AsyncRouterClient, tier: str, ready: asyncio.Event) -> None:
    """A long pinned chat on `tier`, read until cancelled; `ready` at its first delta."""
    options = {"mode": "pinned", "tier": tier, "max_tokens": 200}
    async for event in client.chat_stream("Hold this slot", **options):
        if not isinstance(event, RouteEvent):
            ready.set()


async def _holding(client: AsyncRouterClient, tier: str) -> asyncio.Task[None]:
    ready = asyncio.Event()
    task = asyncio.create_task(_hold(client, tier, ready))
    await asyncio.wait_for(ready.wait(), 10)
    return task


async def test_the_key_over_its_share_is_refused_and_the_other_steps_down(
    mesh: KeyedMesh,
) -> None:
    async with mesh.client(mesh.hog) as hog, mesh.client(mesh.calm) as calm:
        holders = [await _holding(hog, tier) for tier in ("medium",) * 4 + ("large",) * 5]
        await mesh.until_full("medium")
        await mesh.until_full("large")
        # a key alone (hog: 9 chats in flight, nobody else) has the whole mesh: it steps down
        alone = await hog.chat(COMPLEX, max_tokens=3)
        holders.append(await _holding(calm, "small"))  # now hog 9, calm 1 in flight
        with pytest.raises(ChatError) as refused:
            # 10 of 11: past its part (5.5) and chance's allowance (2 x 1.66 + 1)
            await hog.chat(COMPLEX, max_tokens=3)
        answered = await calm.chat(COMPLEX, max_tokens=3)  # 2 of 11: within its part
        for holder in holders:
            holder.cancel()
    route = alone.events[0]
    assert isinstance(route, RouteEvent)
    assert (alone.tier, route.stepped_from) == ("small", "large"), route.reason
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert refused.value.details.reason == "FAIR_SHARE", refused.value.message
    assert refused.value.details.retry_after_s is not None
    route = answered.events[0]
    assert isinstance(route, RouteEvent)
    assert (answered.tier, route.stepped_from) == ("small", "large"), route.reason
    assert answered.text
