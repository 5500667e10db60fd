"""A chat waiting in a tier's queue longer than the router's stall timeout is answered, not
failed as stalled, while the tier keeps reporting; a hung tier's silent call still fails as
stalled. Real processes: three echo tiers (one running slot each, a 3 s answer holds it) and a
router with a 1 s stall timeout, each `python -m ...` on its own port."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError, DeltaEvent
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.tiers import TIER_NAMES
from tests.integration.processes import FAST_FAULTS_ROUTER, ProcessMesh, start_process_mesh

TIERS = {
    "engine": "echo",
    "echo_ttft_ms": 5.0,
    "echo_tokens_per_s": 20.0,  # a 60-token answer holds the one running slot for 3 s
    "max_running": 1,
    "max_queued": 4,
    "max_wait_s": 30.0,
    "max_tokens": 400,
}
LONG_TOKENS = 60
pytestmark = pytest.mark.timeout(300)  # four processes start on a busy 2-core machine


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[ProcessMesh]:
    models = dict.fromkeys(TIER_NAMES, tmp_path)  # the echo engine reads no model
    started = await start_process_mesh(
        tmp_path / "mesh", models, tier_options=TIERS, router_options=FAST_FAULTS_ROUTER
    )
    yield started
    started.stop()


async def _tier_status(mesh: ProcessMesh, name: str) -> tier_pb2.TierStatus:
    async with grpc.aio.insecure_channel(mesh.tiers[name].address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        status: tier_pb2.TierStatus = await stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5)
        return status


async def _until_running(mesh: ProcessMesh, name: str) -> None:
    for _ in range(200):
        if (await _tier_status(mesh, name)).running:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never started the long chat")


async def _first_delta_s(client: AsyncRouterClient, tokens: int) -> tuple[float, str]:
    """Seconds to the first delta of a chat pinned to small, and its whole text."""
    loop = asyncio.get_running_loop()
    sent, first, text = loop.time(), None, ""
    async for event in client.chat_stream(
        "Where is my order?", mode="pinned", tier="small", max_tokens=tokens, timeout=60
    ):
        if isinstance(event, DeltaEvent) and event.text:
            first = first if first is not None else loop.time() - sent
            text += event.text
    assert first is not None
    return first, text


async def test_a_chat_queued_past_the_stall_timeout_is_answered(mesh: ProcessMesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        long = asyncio.create_task(_first_delta_s(client, LONG_TOKENS))
        await _until_running(mesh, "small")  # the long chat holds small's only slot
        waited_s, text = await _first_delta_s(client, 4)  # queued behind it for about 3 s
        await long
    assert waited_s > 1.5  # it did wait past the 1 s stall timeout...
    assert len(text.split()) == 4  # ...and was answered whole, on small
    assert (await _tier_status(mesh, "small")).completed == 2


async def test_a_hung_tier_with_a_queue_still_fails_its_silent_call(mesh: ProcessMesh) -> None:
    small = mesh.tiers["small"]
    async with AsyncRouterClient(mesh.address) as client:
        long = asyncio.create_task(_first_delta_s(client, LONG_TOKENS))
        await _until_running(mesh, "small")
        queued = asyncio.create_task(_first_delta_s(client, 4))
        for _ in range(100):  # the second chat waits in small's queue
            if (await _tier_status(mesh, "small")).queued:
                break
            await asyncio.sleep(0.05)
        small.signal(signal.SIGSTOP)
        try:
            with pytest.raises(ChatError) as caught:
                await asyncio.wait_for(queued, 30)
        finally:
            small.signal(signal.SIGCONT)
        long.cancel()
    assert caught.value.code == "UNAVAILABLE"
    assert "stalled: no first chunk from tier small" in caught.value.message
