"""The router's and tiers' own errors carry google.rpc details: a bad field names itself in
BadRequest, overload carries RetryInfo, every error a stable ErrorInfo reason. Real router and
tiers (the tiny model)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from tests.integration.mesh import Mesh, start_mesh


@pytest.fixture
async def mesh(tiny_model_dir: Path) -> AsyncIterator[Mesh]:
    mesh = await start_mesh(tiny_model_dir, router_options={"max_inflight": 1})
    yield mesh
    await mesh.stop()


async def test_a_bad_field_is_named_in_bad_request(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        with pytest.raises(ChatError) as refused:
            await client.chat("Hi", max_tokens=0)
    error = refused.value
    assert error.code == "INVALID_ARGUMENT"
    assert [field for field, _ in error.details.field_violations] == ["max_tokens"]
    assert error.details.reason == "INVALID_REQUEST"


async def test_router_at_capacity_says_when_to_retry(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        first = client.chat_stream("What is your return policy?", max_tokens=64)
        await anext(first)  # holds the router's one slot
        with pytest.raises(ChatError) as refused:
            await client.chat("Hi")
        await first.aclose()
    error = refused.value
    assert error.code == "RESOURCE_EXHAUSTED"
    assert error.details.reason == "ROUTER_AT_CAPACITY"
    assert error.retry_after_s is not None and error.retry_after_s > 0


async def test_a_tier_names_the_bad_field_too(mesh: Mesh) -> None:
    async with grpc.aio.insecure_channel(mesh.tiers["small"].address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        call = stub.Generate(tier_pb2.GenerateRequest(request_id="r1", prompt="Hi", max_tokens=0))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in call:
                pass
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = parse_status_details(refused.value.trailing_metadata())
    assert [field for field, _ in details.field_violations] == ["max_tokens"]


async def test_a_full_tier_s_retry_delay_reaches_the_client(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(
        tiny_model_dir,
        tiers=("small",),
        tier_options={"max_running": 1, "max_queued": 0},
        # one load report at start: the router learns of the slot taken below only by the
        # tier's refusal (the call is not its own, and no report comes)
        router_options={
            "draft_tier": "small",
            "refine_tier": "small",
            "load_watch_interval_ms": 60000,
            "load_stale_ms": 120000,
        },
    )
    try:
        async with (
            AsyncRouterClient(mesh.address) as client,
            grpc.aio.insecure_channel(mesh.tiers["small"].address) as channel,
        ):
            request = tier_pb2.GenerateRequest(request_id="held", prompt="Hi", max_tokens=200)
            held = tier_pb2_grpc.TierServiceStub(channel).Generate(request)
            await held.read()  # the tier's one running slot is taken
            with pytest.raises(ChatError) as refused:
                await client.chat("Hi", mode="pinned", tier="small")
            held.cancel()
    finally:
        await mesh.stop()
    error = refused.value
    assert error.code == "RESOURCE_EXHAUSTED", error
    assert error.message.startswith("tier small: ")
    assert error.details.reason == "OVERLOADED"
    assert error.retry_after_s is not None and error.retry_after_s > 0
