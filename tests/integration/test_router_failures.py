"""Failure paths through a real router and real tiers: cancel, deadline, bad input, overload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError, FinalEvent, RouteEvent
from tiermesh.v1 import router_pb2, router_pb2_grpc

from tests.integration.mesh import hold_stream, leave_after_first_delta, start_mesh

PROMPT = "What is your return policy?"
LONG = {"max_tokens": 400}  # router limit for the long streams these tests hold open


async def test_client_leaving_cancels_every_upstream_call(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_tokens": 400}, router_options=LONG)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            await leave_after_first_delta(client, PROMPT, mode="progressive", max_tokens=400)
        for tier in ("small", "large"):
            status = await mesh.wait_idle(tier)
            assert status.completed == 0, f"{tier} finished instead of being cancelled"
        assert mesh.router.servicer.inflight == 0
    finally:
        await mesh.stop()


async def test_deadline_is_exceeded_and_tiers_stop(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_tokens": 400}, router_options=LONG)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT, mode="progressive", max_tokens=400, timeout=0.05)
        assert caught.value.code == "DEADLINE_EXCEEDED"
        for tier in ("small", "large"):
            await mesh.wait_idle(tier)
    finally:
        await mesh.stop()


BAD_REQUESTS = [
    ({}, "messages"),
    ({"prompt": "   "}, "prompt"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ({"prompt": PROMPT, "max_tokens": 100_000}, "max_tokens"),
    ({"prompt": PROMPT, "mode": router_pb2.MODE_PINNED, "tier": "huge"}, "tier"),
    ({"prompt": PROMPT, "mode": router_pb2.MODE_PINNED}, "tier"),
    ({"prompt": PROMPT, "mode": 7}, "mode"),
    ({"prompt": "x" * 9000}, "prompt"),
    ({"prompt": PROMPT, "sampling": {"temperature": 5.0}}, "sampling.temperature"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"prompt": PROMPT, "request_id": "r" * 200}, "request_id"),
]


async def test_bad_input_is_invalid_argument_naming_the_field(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir)
    try:
        async with grpc.aio.insecure_channel(mesh.address) as channel:
            stub = router_pb2_grpc.RouterServiceStub(channel)
            for fields, field in BAD_REQUESTS:
                call = stub.Chat(router_pb2.ChatRequest(**fields), timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    async for _ in call:
                        pass
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
                assert caught.value.details().startswith(field + ":"), caught.value.details()
    finally:
        await mesh.stop()


async def test_prompt_over_the_tier_token_limit_keeps_the_tier_code(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_prompt_tokens": 16})
    try:
        async with AsyncRouterClient(mesh.address) as client:
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT * 10, mode="pinned", tier="small", max_tokens=4)
        assert caught.value.code == "INVALID_ARGUMENT"
        assert "prompt:" in caught.value.message and "limit of 16 tokens" in caught.value.message
    finally:
        await mesh.stop()


async def test_tier_overload_is_resource_exhausted_not_a_hang(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(
        tiny_model_dir,
        tier_options={"max_running": 1, "max_queued": 0, "max_tokens": 400},
        router_options=LONG,
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, PROMPT, mode="pinned", tier="small", max_tokens=400)
            )
            await asyncio.wait_for(ready.wait(), 10)
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=4, timeout=10)
            assert caught.value.code == "RESOURCE_EXHAUSTED"
            assert "tier at capacity" in caught.value.message
            holder.cancel()
        status = await mesh.wait_idle("small")
        assert status.rejected == 1
    finally:
        await mesh.stop()


async def test_router_overload_is_resource_exhausted(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(
        tiny_model_dir, tier_options={"max_tokens": 400}, router_options={**LONG, "max_inflight": 1}
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, PROMPT, mode="pinned", tier="small", max_tokens=400)
            )
            await asyncio.wait_for(ready.wait(), 10)
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT, max_tokens=4, timeout=10)
            assert caught.value.code == "RESOURCE_EXHAUSTED"
            assert "router at capacity" in caught.value.message
            holder.cancel()
    finally:
        await mesh.stop()


async def test_the_router_limit_refuses_batch_first(tiny_model_dir: Path) -> None:
    """max_inflight 2: batch may hold one chat of it, interactive and critical both."""
    mesh = await start_mesh(
        tiny_model_dir, tier_options={"max_tokens": 400}, router_options={**LONG, "max_inflight": 2}
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, PROMPT, mode="pinned", tier="small", max_tokens=400)
            )
            await asyncio.wait_for(ready.wait(), 10)
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT, max_tokens=4, timeout=10, priority="batch")
            answered = await client.chat(PROMPT, max_tokens=4, timeout=10, priority="critical")
            holder.cancel()
        assert caught.value.code == "RESOURCE_EXHAUSTED"
        assert "(limit 1 for batch chats, of max_inflight 2)" in caught.value.message
        assert caught.value.details.reason == "ROUTER_AT_CAPACITY"
        assert answered.text
    finally:
        await mesh.stop()


async def test_draining_tier_finishes_in_flight_streams(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_tokens": 400}, router_options=LONG)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, PROMPT, mode="pinned", tier="small", max_tokens=300)
            )
            await asyncio.wait_for(ready.wait(), 10)
            await mesh.tiers["small"].running.drain(30)
            final = await asyncio.wait_for(holder, 30)
            assert isinstance(final, FinalEvent) and final.tier == "small"
            with pytest.raises(ChatError) as caught:
                await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=4)
            assert caught.value.code == "UNAVAILABLE"
    finally:
        await mesh.stop()


async def test_two_chats_with_one_client_id_are_apart_at_the_tier(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_tokens": 400}, router_options=LONG)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            options = {"mode": "pinned", "tier": "small", "max_tokens": 300}
            reference = await client.chat(PROMPT, **options)
            ready = asyncio.Event()
            kept = asyncio.create_task(
                hold_stream(client, ready, PROMPT, request_id="dup", **options)
            )
            await asyncio.wait_for(ready.wait(), 10)
            # the same client id, cancelled: it must not abort the first chat at the tier
            await leave_after_first_delta(client, PROMPT, request_id="dup", **options)
            final = await asyncio.wait_for(kept, 30)
        assert isinstance(final, FinalEvent)
        assert final.text == reference.text  # whole, not cut short
    finally:
        await mesh.stop()


async def test_client_ids_of_the_longest_length_reach_the_tier(
    tiny_model_dir: Path,
) -> None:
    mesh = await start_mesh(tiny_model_dir)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            result = await client.chat(PROMPT, max_tokens=4, request_id="r" * 128)
        assert result.final.tier in ("small", "medium", "large")
    finally:
        await mesh.stop()


async def test_draining_tier_leaves_routing_at_once(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_tokens": 400}, router_options=LONG)
    try:
        async with AsyncRouterClient(mesh.address) as client:
            assert (await client.chat(PROMPT, max_tokens=4)).tier == "small"
            ready = asyncio.Event()
            holder = asyncio.create_task(
                hold_stream(client, ready, PROMPT, mode="pinned", tier="small", max_tokens=300)
            )
            await asyncio.wait_for(ready.wait(), 10)
            draining = asyncio.create_task(mesh.tiers["small"].running.drain(60))
            deadline = asyncio.get_running_loop().time() + 10
            while True:  # the router hears the health change; bounded, not measured
                result = await client.chat(PROMPT, max_tokens=4)  # every one is answered
                route = result.events[0]
                assert isinstance(route, RouteEvent)
                if "fallback medium" in route.reason:
                    break
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            assert "small health NOT_SERVING (draining)" in route.reason
            assert result.tier == "medium"
            final = await asyncio.wait_for(holder, 30)  # the stream in flight still finishes
            assert isinstance(final, FinalEvent) and final.tier == "small"
            # the router let go of its load and health streams: the drain ends with the last
            # stream in flight, not at its 60 s grace (this bound is a guard, not a measurement)
            await asyncio.wait_for(draining, 30)
    finally:
        await mesh.stop()


async def test_invalid_utf8_is_invalid_argument_naming_the_field(tiny_model_dir: Path) -> None:
    mesh = await start_mesh(tiny_model_dir)
    try:
        request = router_pb2.ChatRequest(messages=[{"role": "user", "content": "MARKER"}])
        data = request.SerializeToString().replace(b"MARKER", b"\xff\xfeXXXX")
        async with grpc.aio.insecure_channel(mesh.address) as channel:
            chat = channel.unary_stream(
                "/tiermesh.v1.RouterService/Chat",
                request_serializer=lambda raw: raw,
                response_deserializer=router_pb2.ChatEvent.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in chat(data, timeout=10):
                    pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == "messages[0].content: not valid UTF-8"
    finally:
        await mesh.stop()
