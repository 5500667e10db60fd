"""The hop benchmark's bare gRPC relay (services/bench/grpc_relay_floor.py) against a real torch
tier and beside a real router on the same tier: it keeps the router's event order for a pinned
chat and relays the very answer the router gives, so timing the two side by side compares
like with like; a tier that is down reaches its caller as UNAVAILABLE."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from tiermesh.v1 import router_pb2, router_pb2_grpc

from services.bench.grpc_relay_floor import start_relay_floor
from services.common.ports import free_port
from tests.integration.mesh import start_mesh

PINNED = router_pb2.ChatRequest(
    prompt="What is your return policy?", mode=router_pb2.MODE_PINNED, tier="small", max_tokens=12
)


async def _events(address: str) -> list[router_pb2.ChatEvent]:
    async with grpc.aio.insecure_channel(address) as channel:
        return [e async for e in router_pb2_grpc.RouterServiceStub(channel).Chat(PINNED)]


async def test_the_floor_relays_the_routers_answer_in_the_routers_event_order(
    tiny_model_dir: Path,
) -> None:
    mesh = await start_mesh(tiny_model_dir, tiers=("small", "large"))
    floor = await start_relay_floor(mesh.tiers["small"].address)
    try:
        relayed = await _events(f"127.0.0.1:{floor.port}")
        routed = await _events(mesh.address)
    finally:
        await floor.stop()
        await mesh.stop()

    def shape(events: list[router_pb2.ChatEvent]) -> list[str]:
        kinds = [str(e.WhichOneof("event")) for e in events]
        return [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]

    assert shape(relayed) == ["route", "revision_start", "delta", "final"]
    assert [k for k in shape(routed) if k != "revision_end"] == shape(relayed)
    text = "".join(e.delta.text for e in relayed if e.HasField("delta"))
    assert text and text == relayed[-1].final.text == routed[-1].final.text
    assert relayed[0].route.tiers == ["small"] and relayed[0].route.request_id
    usage = relayed[-1].final.usage[0].usage
    assert usage.completion_tokens == sum(len(e.delta.token_ids) for e in relayed[1:-1]) > 0


async def test_a_tier_that_is_down_is_unavailable_through_the_floor() -> None:
    floor = await start_relay_floor(f"127.0.0.1:{free_port()}")  # nothing listens there
    try:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _events(f"127.0.0.1:{floor.port}")
    finally:
        await floor.stop()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
