"""A secure mesh with real handshakes: a tier that accepts only the router's certificate, a
router speaking TLS to clients and mTLS to the tier, and API keys at the router (scopes,
revocation, rate limits with RetryInfo). Real torch tier (the tiny model), real router."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError, tls_credentials
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import RouterConfig, TierConfig
from services.common.config_loading import build_config
from services.router.server import RouterServer, start_router
from services.security.api_keys import create_key, revoke_key
from services.security.certs import init_ca, issue
from services.security.settings import ServiceSecurity
from services.security.tls import TlsFiles, channel_credentials
from services.tier.server import TierServer, start_tier

ROUTER_ID = "spiffe://tiermesh/router"


@dataclass
class SecureMesh:
    router: RouterServer
    tier: TierServer
    pki: Path
    keys: Path
    key: str  # scopes chat and feedback

    def client(self, api_key: str | None = "", *, tls: bool = True) -> AsyncRouterClient:
        credentials = tls_credentials(self.pki / "ca.pem") if tls else None
        address = f"localhost:{self.router.port}"
        return AsyncRouterClient(address, credentials=credentials, api_key=api_key)


def _files(pki: Path, stem: str) -> TlsFiles:
    return TlsFiles(pki / "ca.pem", pki / f"{stem}.pem", pki / f"{stem}-key.pem")


@pytest.fixture
async def mesh(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[SecureMesh]:
    pki = tmp_path / "certs"
    init_ca(pki)
    for name in ("router", "tier/small", "gateway"):
        issue(pki, name)
    keys = tmp_path / "keys.json"
    _, key = create_key(keys, "app", ("chat", "feedback"))
    tier_security = ServiceSecurity(_files(pki, "tier-small"), allowed_callers=(ROUTER_ID,))
    tier = await start_tier(
        build_config(TierConfig, {"name": "small", "model_path": str(tiny_model_dir)}),
        tier_security,
    )
    try:
        router_security = ServiceSecurity(
            _files(pki, "router"), client_auth="optional", keys_file=keys
        )
        address = f"localhost:{tier.port}"  # one tier process serves all three names here
        options = {"port": 0, "tiers": {"small": address, "medium": address, "large": address}}
        router = await start_router(build_config(RouterConfig, options), router_security)
        try:
            yield SecureMesh(router, tier, pki, keys, key)
        finally:
            await router.stop(0)
    finally:
        await tier.stop(0)


async def _chat(client: AsyncRouterClient) -> str:
    async with client:
        result = await client.chat("Hi", mode="pinned", tier="small", max_tokens=4, timeout=30)
    return result.tier


async def test_a_key_over_tls_gets_an_answer(mesh: SecureMesh) -> None:
    assert await _chat(mesh.client(mesh.key)) == "small"


async def test_no_key_or_a_bad_key_is_unauthenticated(mesh: SecureMesh) -> None:
    for key in (None, mesh.key[:-2] + "xx"):
        client = mesh.client(key)
        with pytest.raises(ChatError) as refused:
            await _chat(client)
        assert refused.value.code == "UNAUTHENTICATED"
        assert refused.value.details.reason == "API_KEY_INVALID"


async def test_a_key_without_the_chat_scope_is_denied(mesh: SecureMesh) -> None:
    _, feedback_only = create_key(mesh.keys, "feedback-bot", ("feedback",))
    await asyncio.sleep(1.1)  # the router re-reads the key file at most once a second
    with pytest.raises(ChatError) as refused:
        await _chat(mesh.client(feedback_only))
    assert refused.value.code == "PERMISSION_DENIED"
    assert "lacks the 'chat' scope" in refused.value.message


async def test_a_key_may_ask_for_its_highest_priority_and_no_higher(mesh: SecureMesh) -> None:
    _, capped = create_key(mesh.keys, "capped", ("chat",), max_priority="interactive")
    await asyncio.sleep(1.1)  # the router re-reads the key file at most once a second
    options = {"mode": "pinned", "tier": "small", "max_tokens": 4, "timeout": 30}
    async with mesh.client(capped) as client:
        answered = await client.chat("Hi", priority="interactive", **options)
        with pytest.raises(ChatError) as refused:
            await client.chat("Hi", priority="critical", **options)
    assert answered.events[0].priority == "interactive"  # type: ignore[union-attr]
    assert refused.value.code == "PERMISSION_DENIED"
    assert refused.value.message == (
        "priority: this API key may ask for interactive at most, not critical"
    )


async def test_a_revoked_key_stops_within_the_watch_interval(mesh: SecureMesh) -> None:
    assert await _chat(mesh.client(mesh.key)) == "small"
    revoke_key(mesh.keys, "app")
    await asyncio.sleep(1.1)
    with pytest.raises(ChatError) as refused:
        await _chat(mesh.client(mesh.key))
    assert refused.value.code == "UNAUTHENTICATED"


async def test_over_the_rate_is_resource_exhausted_with_retry_info(mesh: SecureMesh) -> None:
    _, limited = create_key(mesh.keys, "slow", ("chat",), rpm=1)
    await asyncio.sleep(1.1)
    assert await _chat(mesh.client(limited)) == "small"
    with pytest.raises(ChatError) as refused:
        await _chat(mesh.client(limited))
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert refused.value.details.reason == "RATE_LIMITED"
    assert refused.value.retry_after_s is not None and 0 < refused.value.retry_after_s <= 60


async def test_plaintext_to_the_router_gets_no_answer(mesh: SecureMesh) -> None:
    with pytest.raises(ChatError) as refused:
        await _chat(mesh.client(mesh.key, tls=False))
    assert refused.value.code == "UNAVAILABLE"


async def test_the_tier_refuses_a_certificate_that_is_not_the_routers(mesh: SecureMesh) -> None:
    for stem, expected in (("gateway", grpc.StatusCode.PERMISSION_DENIED), ("router", None)):
        credentials = channel_credentials(_files(mesh.pki, stem))
        async with grpc.aio.secure_channel(f"localhost:{mesh.tier.port}", credentials) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            request = tier_pb2.GetStatusRequest()
            if expected is None:
                assert (await stub.GetStatus(request, timeout=10)).tier == "small"
                continue
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetStatus(request, timeout=10)
            assert refused.value.code() == expected


async def test_feedback_only_from_the_key_that_asked_and_once(mesh: SecureMesh) -> None:
    _, other = create_key(mesh.keys, "other-app", ("chat", "feedback"))
    await asyncio.sleep(1.1)
    async with mesh.client(mesh.key) as client:
        result = await client.chat("Hi", max_tokens=4, timeout=30)  # routed: the policy decides
        request_id = result.events[0].request_id  # the RouteEvent
        async with mesh.client(other) as stranger:
            with pytest.raises(ChatError) as refused:
                await stranger.feedback(request_id, 0.0)
        assert refused.value.code == "PERMISSION_DENIED"
        assert "made by another caller" in refused.value.message
        assert await client.feedback(request_id, 1.0) is True
        assert await client.feedback(request_id, 1.0) is False  # once per request


def test_plaintext_beyond_loopback_refuses_to_start() -> None:
    from services.common.errors import ConfigError

    with pytest.raises(ConfigError, match=r"refusing to listen on 0\.0\.0\.0 without TLS"):
        ServiceSecurity().check_listen("0.0.0.0", "router")
    ServiceSecurity(insecure=True).check_listen("0.0.0.0", "router")
    ServiceSecurity().check_listen("127.0.0.1", "router")
