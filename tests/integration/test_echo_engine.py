"""The echo engine behind a real tier server (port 0) and a real router: the deterministic
answer and its chunking, max_tokens, bounded admission (RESOURCE_EXHAUSTED), cancellation and
deadlines freeing the slot, and the load report."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.tier.echo_engine import echo_answer, echo_text
from services.tier.server import TierServer, start_tier
from tests.integration.mesh import start_mesh

PROMPT = "Where is my order?"


async def _tier(**options: object) -> TierServer:
    config = {"name": "small", "model_path": "unused", "engine": "echo", **options}
    return await start_tier(build_config(TierConfig, config))


@pytest.fixture
async def tier() -> AsyncIterator[TierServer]:
    server = await _tier(echo_ttft_ms=1.0, echo_tokens_per_s=0.0, tokens_per_chunk=3)
    yield server
    await server.stop(0)


def _request(request_id: str, max_tokens: int, prompt: str = PROMPT) -> tier_pb2.GenerateRequest:
    return tier_pb2.GenerateRequest(request_id=request_id, prompt=prompt, max_tokens=max_tokens)


async def test_a_stop_sequence_ends_the_echo_answer_and_frees_the_slot(tier: TierServer) -> None:
    whole = echo_text(echo_answer(tuple(PROMPT.encode()), 30))
    stop = whole[10:13]
    request = _request("s", 30)
    request.sampling.CopyFrom(common_pb2.SamplingParams(stop=[stop]))
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        chunks = [chunk async for chunk in stub.Generate(request)]
        status = await _idle(stub)
    assert "".join(chunk.text for chunk in chunks) == whole[: whole.find(stop)]
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage.completion_tokens < 30
    assert status.running == 0


async def _idle(stub: tier_pb2_grpc.TierServiceStub) -> tier_pb2.TierStatus:
    for _ in range(200):
        status = await stub.GetStatus(tier_pb2.GetStatusRequest())
        if status.running == 0 and status.queued == 0:
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"tier still busy: {status}")


async def test_streams_the_deterministic_answer_in_chunks(tier: TierServer) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        chunks = [chunk async for chunk in stub.Generate(_request("a", 10))]
        again = [chunk async for chunk in stub.Generate(_request("b", 10))]
        other = [chunk async for chunk in stub.Generate(_request("c", 10, "Another question"))]
        status = await stub.GetStatus(tier_pb2.GetStatusRequest())
    expected = echo_answer(tuple(PROMPT.encode()), 10)
    ids = [token for chunk in chunks for token in chunk.token_ids]
    assert ids == expected
    assert "".join(chunk.text for chunk in chunks) == echo_text(expected)
    assert [len(chunk.token_ids) for chunk in chunks] == [1, 3, 3, 3]  # first alone, then 3
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len(PROMPT.encode())
    assert [t for c in again for t in c.token_ids] == expected
    assert [t for c in other for t in c.token_ids] != expected
    assert (status.model, status.engine, status.completed) == ("echo", "echo", 3)


async def test_over_max_tokens_is_invalid(tier: TierServer) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            [chunk async for chunk in stub.Generate(_request("big", 100_000))]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_tokens" in (raised.value.details() or "")


async def test_bounded_admission_cancel_and_deadline_free_slots() -> None:
    tier = await _tier(echo_ttft_ms=1.0, echo_tokens_per_s=20.0, max_running=1, max_queued=1)
    try:
        async with grpc.aio.insecure_channel(tier.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            running = stub.Generate(_request("running", 200))
            first = await running.read()  # holds the one running slot
            assert len(first.token_ids) == 1
            queued = stub.Generate(_request("queued", 5))
            for _ in range(100):  # until the second request waits in the queue
                status = await stub.GetStatus(tier_pb2.GetStatusRequest())
                if status.queued == 1:
                    break
                await asyncio.sleep(0.02)
            assert (status.running, status.queued) == (1, 1)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(_request("refused", 5)).read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            running.cancel()  # the client leaves: its slot goes to the queued request
            tokens = [t async for chunk in queued for t in chunk.token_ids]
            assert len(tokens) == 5
            with pytest.raises(grpc.aio.AioRpcError) as late:
                [c async for c in stub.Generate(_request("slow", 200), timeout=0.3)]
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            status = await _idle(stub)
            assert status.rejected == 1
    finally:
        await tier.stop(0)


async def test_router_over_echo_tiers_answers_deterministically() -> None:
    mesh = await start_mesh(
        Path("unused"),  # the echo engine loads no model
        tier_options={"engine": "echo", "echo_ttft_ms": 1.0, "echo_tokens_per_s": 0.0},
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            answers = [
                await client.chat(
                    PROMPT, mode="progressive", progressive_gate="always", max_tokens=12
                )
                for _ in range(2)
            ]
            pinned = await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=7)
    finally:
        await mesh.stop()
    assert answers[0].text == answers[1].text
    assert len(answers[0].text.split()) == 12
    assert answers[0].tier == "large"
    assert pinned.tier == "small" and len(pinned.text.split()) == 7
