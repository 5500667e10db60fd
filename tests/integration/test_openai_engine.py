"""A tier whose engine is a remote OpenAI-compatible server (`engine = "openai"`), against a real
one: tiermesh's own HTTP gateway, over a router and echo tiers, on a loop of its own (a thread),
as a server a team already runs would be. The remote tier streams its chats (directly, and
behind a router), passes sampling through, closes the remote stream when its caller leaves or
its deadline passes, maps a 429 to RESOURCE_EXHAUSTED with the Retry-After as its retry delay,
a dead server to UNAVAILABLE and NOT_SERVING, and bad input to INVALID_ARGUMENT naming the
field. The gateway streams no token ids, so these streams are text with the server's counts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, DeltaEvent
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import RouterConfig, TierConfig
from services.common.config_loading import build_config
from services.common.errors import ConfigError
from services.common.ports import free_port
from services.common.serving import health_status
from services.router.server import start_router
from services.security.api_keys import create_key
from services.security.settings import ServiceSecurity
from services.tier import openai_engine
from services.tier.echo_engine import echo_answer, echo_text
from services.tier.engine import GenerationChunk, GenerationRequest
from services.tier.server import TierServer, start_tier
from tests.integration.gateway_mesh import GatewayMesh
from tests.tiny_model import build_tiny_model

PROMPT = "Where is my order?"
KEY_ENV = "TIERMESH_TEST_REMOTE_KEY"
ECHO = {
    "engine": "echo",
    "model_path": "echo",
    "echo_ttft_ms": 2.0,
    "echo_tokens_per_s": 50.0,  # 200 tokens take 4 s: long enough to leave one midway
    "tokens_per_chunk": 2,
}


@pytest.fixture(scope="module")
def remote() -> Iterator[GatewayMesh]:
    """The remote server: gateway, router and echo tiers on their own event loop."""
    mesh = GatewayMesh.start(Path("echo"), tier_options=ECHO)
    yield mesh
    mesh.stop()


def _rendered(prompt: str) -> bytes:
    """The prompt as the inner echo tier renders the chat (it has no chat template)."""
    return f"user: {prompt}\nassistant:".encode()


def echo_reply(prompt: str, tokens: int, seed: int | None = None) -> str:
    """What the remote's echo tiers answer to a one-message chat."""
    return echo_text(echo_answer(tuple(_rendered(prompt)), tokens, seed))


async def _remote_tier(url: str, **options: object) -> TierServer:
    config = {
        "name": "large",
        "model_path": "unused",
        "engine": "openai",
        "remote_url": f"{url}/v1",
        "remote_model": "tiermesh-small",
        "max_tokens": 400,
        **options,
    }
    return await start_tier(build_config(TierConfig, config))


@pytest.fixture
async def tier(remote: GatewayMesh) -> AsyncIterator[TierServer]:
    server = await _remote_tier(remote.url)
    yield server
    await server.stop(0)


def _request(request_id: str, max_tokens: int, prompt: str = PROMPT) -> tier_pb2.GenerateRequest:
    return tier_pb2.GenerateRequest(request_id=request_id, prompt=prompt, max_tokens=max_tokens)


async def _generate(
    address: str, request: tier_pb2.GenerateRequest
) -> list[tier_pb2.GenerateChunk]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return [chunk async for chunk in stub.Generate(request)]


async def _refused(address: str, request: tier_pb2.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await _generate(address, request)
    return raised.value


async def _status(address: str) -> tier_pb2.TierStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return await stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5)


async def _until(address: str, ok: object, timeout_s: float = 5.0) -> tier_pb2.TierStatus:
    """Polls the tier's status until `ok(status)`; returns it (fails past timeout_s)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = await _status(address)
        if ok(status):  # type: ignore[operator]
            return status
        assert asyncio.get_running_loop().time() < deadline, f"never so: {status}"
        await asyncio.sleep(0.02)


async def test_a_chat_streams_through_the_remote_tier(
    remote: GatewayMesh, tier: TierServer
) -> None:
    request = _request("a", 12)
    request.sampling.top_logprobs = 1
    chunks = await _generate(tier.address, request)
    status = await _status(tier.address)
    text = "".join(chunk.text for chunk in chunks)
    assert text == echo_reply(PROMPT, 12)
    assert [t for c in chunks for t in c.token_ids] == []  # the gateway sends no token ids
    logprobs = [lp for c in chunks for lp in c.logprobs]
    assert len(logprobs) == 12 and all(lp == pytest.approx(-0.01) for lp in logprobs)
    entries = [e for c in chunks for e in c.token_logprobs]
    assert "".join(e.text for e in entries) == text and all(len(e.top) == 1 for e in entries)
    last = chunks[-1]
    assert last.finish_reason == "length"
    assert last.usage.completion_tokens == 12  # the server's counts
    assert last.usage.prompt_tokens == len(_rendered(PROMPT))
    assert 0 < last.usage.ttft_ms <= last.usage.total_ms
    first = next(c for c in chunks if c.text)
    assert first.model == last.model == "large/tiermesh-small"
    assert (status.engine, status.model, status.serving) == ("openai", "tiermesh-small", True)
    assert status.completed == 1 and status.recent_ttft_ms_p50 > 0 and status.running == 0
    assert [phase.name for phase in status.startup_phases] == ["remote"]


async def test_sampling_and_stop_sequences_pass_through(tier: TierServer) -> None:
    seeded = _request("seed", 10)
    seeded.sampling.seed = 5
    chunks = await _generate(tier.address, seeded)
    assert (
        "".join(c.text for c in chunks) == echo_reply(PROMPT, 10, seed=5) != echo_reply(PROMPT, 10)
    )
    whole = echo_reply(PROMPT, 30)
    stop = whole[10:13]
    stopped = _request("stop", 30)
    stopped.sampling.stop.append(stop)
    chunks = await _generate(tier.address, stopped)
    assert "".join(c.text for c in chunks) == whole[: whole.find(stop)]
    assert chunks[-1].finish_reason == "stop"


async def test_a_router_drafts_and_refines_through_remote_tiers(remote: GatewayMesh) -> None:
    small = await _remote_tier(remote.url, name="small")
    large = await _remote_tier(remote.url, remote_model="tiermesh-large")
    router = await start_router(
        build_config(
            RouterConfig, {"port": 0, "tiers": {"small": small.address, "large": large.address}}
        )
    )
    try:
        async with AsyncRouterClient(router.address) as client:
            pinned = await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8)
            progressive = await client.chat(
                PROMPT, mode="progressive", progressive_gate="always", max_tokens=9
            )
            leaving = client.chat_stream(PROMPT, mode="pinned", tier="small", max_tokens=200)
            async for event in leaving:  # until the remote's first text has come through
                if isinstance(event, DeltaEvent):
                    break
            await leaving.aclose()  # the client leaves: the router, then the remote, let go
            inner = await _until(remote.mesh.tiers["small"].address, lambda s: s.running == 0)
    finally:
        await router.stop(0)
        await small.stop(0)
        await large.stop(0)
    assert pinned.tier == "small" and pinned.text == echo_reply(PROMPT, 8)
    assert progressive.tier == "large" and progressive.text == echo_reply(PROMPT, 9)
    assert inner.running == 0


async def test_leaving_or_a_deadline_closes_the_remote_stream(
    remote: GatewayMesh, tier: TierServer
) -> None:
    inner = remote.mesh.tiers["small"].address
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        call = stub.Generate(_request("leaving", 200))  # 4 s of answer upstream
        first = await call.read()
        assert first.text
        busy = await _until(inner, lambda s: s.running == 1)
        mine = await _status(tier.address)
        call.cancel()
        freed = await _until(inner, lambda s: s.running == 0, timeout_s=2.0)
        with pytest.raises(grpc.aio.AioRpcError) as late:
            [c async for c in stub.Generate(_request("late", 200), timeout=0.5)]
        after_deadline = await _until(inner, lambda s: s.running == 0, timeout_s=2.0)
        own = await _until(tier.address, lambda s: s.running == 0)
    assert busy.running == 1 and mine.running == 1
    assert freed.running == 0  # the gateway saw the disconnect and cancelled the chat
    assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert after_deadline.running == 0 and own.queued == 0


async def test_abort_ends_the_stream_and_closes_the_remote_one(
    remote: GatewayMesh, tier: TierServer
) -> None:
    engine = tier.engine
    chunks: list[GenerationChunk] = []

    async def consume() -> None:
        async for chunk in engine.generate(GenerationRequest("aborted", 200, prompt=PROMPT)):
            chunks.append(chunk)

    reading = asyncio.ensure_future(consume())
    while not chunks:
        await asyncio.sleep(0.01)
    await engine.abort("aborted")
    await asyncio.wait_for(reading, 2.0)  # ends at once, unfinished
    inner = await _until(remote.mesh.tiers["small"].address, lambda s: s.running == 0, 2.0)
    assert chunks[-1].finish_reason is None and engine.load().running == 0
    assert inner.running == 0


@pytest.fixture(scope="module")
def keyed(
    remote: GatewayMesh, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """A second router over the same tiers that enforces API keys, and a gateway in front of
    it; yields its URL and a key allowed one request per minute."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    _, secret = create_key(keys, "tiny", ("chat",), rpm=1)
    assert remote.mesh is not None
    tiers = {name: server.address for name, server in remote.mesh.tiers.items()}
    config = build_config(RouterConfig, {"port": 0, "tiers": tiers})
    router = remote.run(start_router(config, ServiceSecurity(keys_file=keys)))
    yield remote.extra_gateway(router=router.address), secret
    remote.run(router.stop(0))


async def test_a_429_is_resource_exhausted_with_the_retry_after(
    keyed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, secret = keyed
    monkeypatch.setenv(KEY_ENV, secret)
    tier = await _remote_tier(url, remote_api_key_env=KEY_ENV)
    try:
        answered = await _generate(tier.address, _request("one", 4))
        refused = await _refused(tier.address, _request("two", 4))
        status = await _status(tier.address)
    finally:
        await tier.stop(0)
    assert "".join(c.text for c in answered) == echo_reply(PROMPT, 4)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "HTTP 429" in (refused.details() or "")
    details = parse_status_details(refused.trailing_metadata())
    # the key refills one request a minute: the gateway's Retry-After, in whole seconds
    assert details.retry_after_s is not None and 55 <= details.retry_after_s <= 60
    assert details.reason == "OVERLOADED"
    assert status.serving  # a refusal says nothing of the server's health


async def test_a_refused_or_missing_api_key(
    keyed: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = keyed
    monkeypatch.setenv(KEY_ENV, "tmk_000000000000_not-a-key")
    tier = await _remote_tier(url, remote_api_key_env=KEY_ENV)
    try:
        refused = await _refused(tier.address, _request("bad-key", 4))
    finally:
        await tier.stop(0)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE  # this tier cannot serve; another may
    assert "API key" in (refused.details() or "") and "HTTP 401" in (refused.details() or "")
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ConfigError, match=f"remote_api_key_env: .*{KEY_ENV}"):
        await _remote_tier(url, remote_api_key_env=KEY_ENV)


async def test_a_dead_server_is_not_serving_and_unavailable() -> None:
    port, dead = free_port(), free_port()  # nothing listens on `dead`
    starting = asyncio.ensure_future(
        _remote_tier(f"http://127.0.0.1:{dead}", port=port, name="medium")
    )
    address = f"127.0.0.1:{port}"
    try:
        health = "UNAVAILABLE"
        for _ in range(250):  # until the tier's server answers at all
            health = await asyncio.to_thread(health_status, address)
            if not health.startswith("UNAVAILABLE"):
                break
            await asyncio.sleep(0.02)
        refused = await _refused(address, _request("dead", 4))
        status = await _status(address)
        await asyncio.sleep(0.5)  # it keeps waiting for the server, NOT_SERVING
        assert not starting.done()
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
    assert health == "NOT_SERVING"
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert f"127.0.0.1:{dead}" in (refused.details() or "")
    assert not status.serving


async def test_a_server_that_stops_answering_takes_the_tier_out_of_service(
    remote: GatewayMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_engine, "PROBE_INTERVAL_S", 0.1)
    url = remote.extra_gateway()
    gateway = remote.extra_gateways.pop()
    tier = await _remote_tier(url)
    try:
        assert (await _status(tier.address)).serving
        remote.run(gateway.stop())
        status = await _until(tier.address, lambda s: not s.serving)
        refused = await _refused(tier.address, _request("gone", 4))
    finally:
        await tier.stop(0)
    assert not status.serving
    assert refused.code() == grpc.StatusCode.UNAVAILABLE


async def test_bad_input_is_invalid_argument_naming_the_field(tier: TierServer) -> None:
    # the tier takes 400 tokens; the remote's router at most 256
    refused = await _refused(tier.address, _request("long", 300))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.details() or "").startswith("max_tokens: ")
    details = parse_status_details(refused.trailing_metadata())
    assert [field for field, _ in details.field_violations] == ["max_tokens"]


async def test_a_continuation_it_cannot_make_is_a_failed_precondition(tier: TierServer) -> None:
    text_only = _request("text-only", 12)
    text_only.continue_text_chars = 5  # an answer streamed as text: no ids to continue from
    refused = await _refused(tier.address, text_only)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "token ids" in (refused.details() or "")
    with_ids = _request("with-ids", 12)
    with_ids.continue_token_ids.extend([300, 301])
    refused = await _refused(tier.address, with_ids)  # the gateway has no /detokenize
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "/detokenize" in (refused.details() or "")


async def test_the_served_model_is_the_first_listed_unless_named(remote: GatewayMesh) -> None:
    tier = await _remote_tier(remote.url, remote_model="")
    try:
        status = await _status(tier.address)
    finally:
        await tier.stop(0)
    assert status.model == "tiermesh-routed"  # the first of the gateway's /v1/models
    with pytest.raises(ConfigError, match="remote_model: 'nope' is not served"):
        await _remote_tier(remote.url, remote_model="nope")


async def test_a_prompt_the_remote_context_cannot_hold_is_prompt_too_long(
    tier: TierServer,
) -> None:
    # the remote's echo tiers take prompts of at most 512 tokens (one per byte)
    refused = await _refused(tier.address, _request("too-long", 4, prompt="ship it? " * 80))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = parse_status_details(refused.trailing_metadata())
    assert details.reason == "PROMPT_TOO_LONG"  # a router moves the chat on to another tier
    assert details.metadata["limit_tokens"] == "512"
    assert int(details.metadata["prompt_tokens"]) > 720


SHORT_CONTEXT = 96


@pytest.fixture(scope="module")
def short_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayMesh]:
    """A remote whose torch tiers' model holds 96 positions (prompt and answer)."""
    model = build_tiny_model(tmp_path_factory.mktemp("short-remote"), context=SHORT_CONTEXT)
    mesh = GatewayMesh.start(model)
    yield mesh
    mesh.stop()


async def test_a_max_tokens_past_the_remote_context_is_fitted_when_the_request_allows(
    short_remote: GatewayMesh,
) -> None:
    tier = await _remote_tier(short_remote.url)
    try:
        fixed = _request("fixed", 90, prompt="What is the price of the blue kettle?")
        refused = await _refused(tier.address, fixed)
        fitted = _request("fitted", 90, prompt="What is the price of the blue kettle?")
        fitted.fit_max_tokens_to_context = True
        chunks = await _generate(tier.address, fitted)
    finally:
        await tier.stop(0)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"context of {SHORT_CONTEXT} tokens" in (refused.details() or "")
    usage = chunks[-1].usage  # asked again for the room the prompt left: the context, full
    assert chunks[-1].finish_reason == "length"
    assert usage.prompt_tokens + usage.completion_tokens == SHORT_CONTEXT
