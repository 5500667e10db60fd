"""A tier's wait queue by priority, on real servers (echo engine, one running slot): requests
waiting for the slot start critical first, then interactive, then batch, whatever their arrival
order, both called directly and through a real router that passes each chat's priority on; at
a full queue a critical request takes the newest batch request's place, and that batch request
is refused with RESOURCE_EXHAUSTED while the critical one is answered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError, DeltaEvent, RouteEvent
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.tier.server import TierServer, start_tier
from tests.integration.mesh import start_mesh

PROMPT = "Where is my order?"
SLOW = {"engine": "echo", "echo_ttft_ms": 1.0, "echo_tokens_per_s": 20.0, "max_running": 1}
PRIORITY = {
    "batch": tier_pb2.QUEUE_PRIORITY_BATCH,
    "interactive": tier_pb2.QUEUE_PRIORITY_INTERACTIVE,
    "critical": tier_pb2.QUEUE_PRIORITY_CRITICAL,
}


async def _tier(max_queued: int) -> TierServer:
    options = {"name": "small", "model_path": "unused", **SLOW, "max_queued": max_queued}
    return await start_tier(build_config(TierConfig, options))


@pytest.fixture
async def stub() -> AsyncIterator[tier_pb2_grpc.TierServiceStub]:
    tier = await _tier(max_queued=3)
    async with grpc.aio.insecure_channel(tier.address) as channel:
        yield tier_pb2_grpc.TierServiceStub(channel)
    await tier.stop(0)


async def _until(
    stub: tier_pb2_grpc.TierServiceStub, ok: Callable[[tier_pb2.TierStatus], bool]
) -> None:
    for _ in range(500):
        status = await stub.GetStatus(tier_pb2.GetStatusRequest())
        if ok(status):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"tier never reached the state: {status}")


async def _queued(stub: tier_pb2_grpc.TierServiceStub, count: int) -> None:
    await _until(stub, lambda status: status.queued == count)


def _request(name: str, priority: str, max_tokens: int = 2) -> tier_pb2.GenerateRequest:
    return tier_pb2.GenerateRequest(
        request_id=name, prompt=PROMPT, max_tokens=max_tokens, queue_priority=PRIORITY[priority]
    )


async def test_waiting_requests_start_by_priority_then_arrival(
    stub: tier_pb2_grpc.TierServiceStub,
) -> None:
    started: list[str] = []

    async def run(name: str, priority: str) -> None:
        async for _ in stub.Generate(_request(name, priority)):
            started.append(name)
            return

    holder = stub.Generate(_request("holder", "interactive", max_tokens=200))
    await anext(aiter(holder))
    waiters = []
    for name, priority in (("b1", "batch"), ("i1", "interactive"), ("c1", "critical")):
        waiters.append(asyncio.create_task(run(name, priority)))
        await _queued(stub, len(waiters))  # so the arrival order is known
    holder.cancel()
    await asyncio.gather(*waiters)
    assert started == ["c1", "i1", "b1"]


async def test_a_critical_request_takes_the_place_of_a_waiting_batch_request() -> None:
    tier = await _tier(max_queued=1)
    try:
        async with grpc.aio.insecure_channel(tier.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            holder = stub.Generate(_request("holder", "interactive", max_tokens=200))
            await anext(aiter(holder))

            async def answer(name: str, priority: str) -> str:
                chunks = [c async for c in stub.Generate(_request(name, priority, max_tokens=3))]
                return "".join(c.text for c in chunks)

            batch = asyncio.create_task(answer("b1", "batch"))
            await _until(stub, lambda s: s.queued == 1)
            critical = asyncio.create_task(answer("c1", "critical"))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await batch
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "its place in a full queue went to a critical request" in str(
                refused.value.details()
            )
            # a batch request arriving now finds a critical one waiting: refused at once
            with pytest.raises(grpc.aio.AioRpcError) as full:
                await answer("b2", "batch")
            assert "1 requests of a higher priority wait" in str(full.value.details())
            holder.cancel()
            assert await critical  # answered, after the holder
    finally:
        await tier.stop(0)


async def test_the_router_passes_each_chat_priority_to_the_tier_queue() -> None:
    mesh = await start_mesh(
        Path("unused"),
        tier_options={**SLOW, "max_queued": 3},
        router_options={"load_watch_interval_ms": 50},
    )
    started: list[str] = []
    try:
        async with (
            AsyncRouterClient(mesh.address) as client,
            grpc.aio.insecure_channel(mesh.tiers["small"].address) as channel,
        ):
            stub = tier_pb2_grpc.TierServiceStub(channel)

            async def run(name: str, priority: str) -> None:
                options = {"mode": "pinned", "tier": "small", "max_tokens": 2}
                async for event in client.chat_stream(PROMPT, priority=priority, **options):
                    if isinstance(event, DeltaEvent):
                        started.append(name)
                        return

            async def hold() -> None:
                options = {"mode": "pinned", "tier": "small", "max_tokens": 200}
                async for _ in client.chat_stream(PROMPT, **options):
                    pass

            holder = asyncio.create_task(hold())
            await _until(stub, lambda s: s.running == 1)
            waiters = []
            for name, priority in (("b1", "batch"), ("i1", "interactive"), ("c1", "critical")):
                waiters.append(asyncio.create_task(run(name, priority)))
                await _queued(stub, len(waiters))
            holder.cancel()
            await asyncio.gather(*waiters)
    finally:
        await mesh.stop()
    assert started == ["c1", "i1", "b1"]


async def test_a_queue_full_of_batch_chats_is_room_for_an_interactive_one() -> None:
    """The router reads the tier's queued batch chats (TierStatus.queued_batch) as no obstacle
    to an interactive chat: routed to small while small's queue is full of batch chats, it stays
    on small (no step to another tier), takes the newest batch chat's place and starts first."""
    mesh = await start_mesh(
        Path("unused"),
        tier_options={**SLOW, "max_queued": 2},
        router_options={"load_watch_interval_ms": 50},
    )
    started: list[str] = []
    pinned = {"mode": "pinned", "tier": "small"}
    try:
        async with (
            AsyncRouterClient(mesh.address) as client,
            grpc.aio.insecure_channel(mesh.tiers["small"].address) as channel,
        ):
            stub = tier_pb2_grpc.TierServiceStub(channel)

            async def run(name: str, **options: object) -> RouteEvent | None:
                route = None
                async for event in client.chat_stream(PROMPT, max_tokens=2, **options):
                    if isinstance(event, RouteEvent):
                        route = event
                    if isinstance(event, DeltaEvent):
                        started.append(name)
                        return route
                return route

            async def hold() -> None:
                async for _ in client.chat_stream(PROMPT, max_tokens=200, **pinned):
                    pass

            holder = asyncio.create_task(hold())
            await _until(stub, lambda s: s.running == 1)
            older = asyncio.create_task(run("b1", **pinned, priority="batch"))
            await _until(stub, lambda s: s.queued_batch == 1)
            newer = asyncio.create_task(run("b2", **pinned, priority="batch"))
            await _until(stub, lambda s: (s.queued, s.queued_batch) == (2, 2))
            await asyncio.sleep(0.2)  # the router's load watch has seen it (every 50 ms)
            interactive = asyncio.create_task(run("i1", mode="routed"))
            with pytest.raises(ChatError) as refused:
                await newer
            holder.cancel()
            route = await interactive
            await older
    finally:
        await mesh.stop()
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert "its place in a full queue went to a interactive request" in refused.value.message
    assert route is not None and (route.tiers, route.stepped_from) == (("small",), "")
    assert started == ["i1", "b1"]
