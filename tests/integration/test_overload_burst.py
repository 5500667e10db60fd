"""Overload on real servers (the tiny GPT-2): a stream that ends hands its running slot on only
once its KV-pool slot is free (so admission never overbooks the pool), and a burst of three
times the mesh's capacity ends every chat with an answer or RESOURCE_EXHAUSTED carrying a retry
delay: no UNKNOWN or INTERNAL."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.tier.engine import GenerationRequest
from services.tier.torch_engine import TorchEngine
from tests.integration.mesh import Mesh, hold_stream, start_mesh

PROMPTS = ["What is your return policy?", "How much does the blue kettle cost?", "Hi there"]


async def test_an_ended_stream_frees_its_pool_slot_before_the_next_starts(
    tiny_model_dir: Path,
) -> None:
    config = TierConfig(
        name="small", model_path=tiny_model_dir, max_running=1, max_queued=1, max_tokens=200
    )
    engine = TorchEngine(config)
    await engine.start()
    try:
        for i in range(12):  # leave after the first chunk, start the next at once, again
            first = engine.generate(GenerationRequest(f"a{i}", 200, prompt="Hi"))
            async with contextlib.aclosing(first):
                await anext(first)
            tokens = [
                t
                async for chunk in engine.generate(GenerationRequest(f"b{i}", 3, prompt="Hi"))
                for t in chunk.token_ids
            ]
            assert len(tokens) == 3
        assert engine._pool is not None and engine._pool.free_slots == 1
    finally:
        await engine.shutdown()


@pytest.fixture
async def mesh(tiny_model_dir: Path) -> AsyncIterator[Mesh]:
    mesh = await start_mesh(
        tiny_model_dir,
        tier_options={"max_running": 2, "max_queued": 2, "max_tokens": 64},
        router_options={"max_inflight": 256, "load_watch_interval_ms": 50},
    )
    yield mesh
    await mesh.stop()


async def test_a_burst_of_three_times_capacity_ends_in_answers_or_refusals(mesh: Mesh) -> None:
    capacity = 3 * (2 + 2)  # three tiers, each 2 running + 2 queued
    outcomes: Counter[str] = Counter()
    delays: list[float] = []

    async def one(client: AsyncRouterClient, i: int) -> None:
        try:
            result = await client.chat(PROMPTS[i % len(PROMPTS)], max_tokens=32, timeout=60)
        except ChatError as e:
            outcomes[e.code] += 1
            if e.retry_after_s is not None:
                delays.append(e.retry_after_s)
            return
        assert result.text
        outcomes["OK"] += 1

    async with AsyncRouterClient(mesh.address) as client:
        await asyncio.gather(*(one(client, i) for i in range(3 * capacity)))
        assert set(outcomes) <= {"OK", "RESOURCE_EXHAUSTED"}, outcomes
        assert outcomes["OK"] >= capacity // 2 and outcomes["RESOURCE_EXHAUSTED"] > 0, outcomes
        assert len(delays) == outcomes["RESOURCE_EXHAUSTED"]  # every refusal says when to retry
        assert all(delay > 0 for delay in delays)
        for tier in mesh.tiers:
            await mesh.wait_idle(tier)
        result = await client.chat(PROMPTS[0], max_tokens=8)  # the mesh answers as before
        assert result.text


async def _router_sees_running(mesh: Mesh, tier: str, running: int) -> None:
    """Waits until the router's last load report of `tier` (the report itself, not the calls
    the router counted since) shows `running` requests."""
    reported = mesh.router.watcher.reported
    while (load := reported[mesh.tiers[tier].address]) is None or load.running != running:
        await asyncio.sleep(0.01)


async def _hold_slot(client: AsyncRouterClient, mesh: Mesh, tier: str) -> asyncio.Task[Any]:
    """A 200-token chat holding the tier's one running slot, once the router has seen it run."""
    ready = asyncio.Event()
    holder = asyncio.create_task(
        hold_stream(client, ready, "Hello", mode="pinned", tier=tier, max_tokens=200)
    )
    await asyncio.wait_for(ready.wait(), 10)
    await _router_sees_running(mesh, tier, 1)
    return holder


async def _small_queues_one(mesh: Mesh) -> None:
    while (await mesh.tier_status("small")).queued == 0:
        await asyncio.sleep(0.02)


async def test_a_refused_chat_goes_on_only_to_a_tier_that_would_start_it_at_once(
    tmp_path: Path,
) -> None:
    """small refuses at admission (its expected wait, one slot held for an unmeasured 1 s, is
    past the chat's 0.8 s deadline). With a free slot on medium the chat is retried there
    unseen; with medium's slot taken the refusal is relayed at once and medium never sees the
    chat (its own admission would have refused it too, and counted it)."""
    mesh = await start_mesh(
        tmp_path,
        tiers=("small", "medium"),
        tier_options={
            "engine": "echo",
            "echo_ttft_ms": 1.0,
            "echo_tokens_per_s": 20.0,  # a held chat of 200 tokens lasts 10 s
            "max_running": 1,
            "max_queued": 4,
        },
        router_options={
            "load_watch_interval_ms": 50,
            "policy": "interim_heuristic",
            "refine_tier": "medium",
        },
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            small = await _hold_slot(client, mesh, "small")
            result = await client.chat("Hi", max_tokens=2, timeout=0.8)
            assert result.tier == "medium"
            assert "small failed before its first token (RESOURCE_EXHAUSTED" in result.final.reason
            assert "retried on medium" in result.final.reason
            await mesh.wait_idle("medium")

            medium = await _hold_slot(client, mesh, "medium")
            with pytest.raises(ChatError) as refused:
                await client.chat("Hi", max_tokens=2, timeout=0.8)
            for holder in (small, medium):
                holder.cancel()
        error = refused.value
        assert error.code == "RESOURCE_EXHAUSTED", error
        assert error.message.startswith("tier small: tier at capacity: it could not start")
        assert error.retry_after_s is not None and error.retry_after_s > 0
        assert (await mesh.tier_status("small")).rejected == 2
        assert (await mesh.tier_status("medium")).rejected == 0
    finally:
        await mesh.stop()


def one_slot_small(max_queued: int) -> dict[str, Any]:
    """start_mesh's options: small alone, an echo tier with one running slot, reporting its load
    every 2 s; an answer of 200 tokens holds the slot for 10 s."""
    return {
        "tiers": ("small",),
        "tier_options": {
            "engine": "echo",
            "echo_ttft_ms": 1.0,
            "echo_tokens_per_s": 20.0,
            "max_running": 1,
            "max_queued": max_queued,
        },
        "router_options": {
            "load_watch_interval_ms": 2000,
            "load_stale_ms": 10000,
            "refine_tier": "small",
        },
    }


async def _queue_directly(mesh: Mesh, tier: str) -> list[tier_pb2.GenerateChunk]:
    """A request sent to the tier itself, not through the router (as another router would):
    the router learns of it only from the tier's next load report."""
    async with grpc.aio.insecure_channel(mesh.tiers[tier].address) as channel:
        request = tier_pb2.GenerateRequest(request_id="direct", prompt="Hi", max_tokens=2)
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return [chunk async for chunk in stub.Generate(request, timeout=30)]


async def test_a_tier_that_refused_is_full_to_the_router_until_its_next_load_report(
    tmp_path: Path,
) -> None:
    """Once small has refused a chat for capacity (its queue filled since its last load report
    by a request the router did not send), the router refuses the next ones itself
    (RESOURCE_EXHAUSTED with a retry delay, `every tier full`), sending small nothing, until
    small reports its load again (every 2 s here)."""
    mesh = await start_mesh(tmp_path, **one_slot_small(max_queued=1))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            holder = await _hold_slot(client, mesh, "small")  # just after a report: 2 s to the next
            waiter = asyncio.create_task(_queue_directly(mesh, "small"))
            await _small_queues_one(mesh)  # the queue's one place taken
            refusals: list[ChatError] = []
            while len(refusals) < 12 and not any(
                e.message.startswith("every tier full") for e in refusals
            ):
                with pytest.raises(ChatError) as refused:
                    await client.chat("Hi", max_tokens=2, timeout=5)
                refusals.append(refused.value)
            holder.cancel()
            assert (await waiter)[-1].finish_reason  # queued, then answered
        by_router = [e for e in refusals if e.message.startswith("every tier full")]
        by_small = [e for e in refusals if e.message.startswith("tier small: ")]
        assert by_router and by_small and len(by_router) + len(by_small) == len(refusals)
        assert [e.details.reason for e in by_small] == ["OVERLOADED"] * len(by_small)
        assert "small refused a call at 1 running, 0 queued" in by_router[0].message
        assert all(e.code == "RESOURCE_EXHAUSTED" for e in refusals)
        assert all(e.retry_after_s is not None and e.retry_after_s > 0 for e in refusals)
        assert (await mesh.tier_status("small")).rejected == len(by_small)
    finally:
        await mesh.stop()


async def test_the_routers_own_calls_count_toward_a_tiers_load_between_its_reports(
    tmp_path: Path,
) -> None:
    """small reports every 2 s. Its one slot and one queue place taken by two chats the router
    sent since its last report, the router counts them itself: the next chat is refused at
    once by the router (`small full (1 running, 1 queued)`), small never sees it, and the
    queued chat is answered."""
    mesh = await start_mesh(tmp_path, **one_slot_small(max_queued=1))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            holder = await _hold_slot(client, mesh, "small")  # counted by small's report
            waiter = asyncio.create_task(client.chat("Hi", max_tokens=2, timeout=30))
            await _small_queues_one(mesh)  # counted by the router only, until the next report
            with pytest.raises(ChatError) as refused:
                await client.chat("Hi", max_tokens=2, timeout=5)
            holder.cancel()
            assert (await waiter).tier == "small"
        error = refused.value
        assert error.code == "RESOURCE_EXHAUSTED", error
        assert error.message == "every tier full: small full (1 running, 1 queued)"
        assert error.retry_after_s is not None and error.retry_after_s > 0
        assert (await mesh.tier_status("small")).rejected == 0
    finally:
        await mesh.stop()


async def test_a_refusal_for_a_short_deadline_leaves_the_tier_open_to_longer_ones(
    tmp_path: Path,
) -> None:
    """small refuses chats whose 0.8 s deadline is shorter than its expected wait (1 s: one
    hold time) with WAIT_PAST_DEADLINE: the router still sends it the next ones (no `every tier
    full` of its own), and a chat with time to wait is queued and answered."""
    mesh = await start_mesh(tmp_path, **one_slot_small(max_queued=4))
    try:
        async with AsyncRouterClient(mesh.address) as client:
            holder = await _hold_slot(client, mesh, "small")
            refusals: list[ChatError] = []
            for _ in range(4):  # well within small's 2 s between load reports
                with pytest.raises(ChatError) as refused:
                    await client.chat("Hi", max_tokens=2, timeout=0.8)
                refusals.append(refused.value)
            patient = asyncio.create_task(client.chat("Hi", max_tokens=2, timeout=30))
            await _small_queues_one(mesh)
            holder.cancel()
            answer = await patient
        assert [e.code for e in refusals] == ["RESOURCE_EXHAUSTED"] * 4
        assert all(e.details.reason == "WAIT_PAST_DEADLINE" for e in refusals), refusals
        assert all(
            e.message.startswith("tier small: tier at capacity: it could not start")
            for e in refusals
        ), refusals
        assert (await mesh.tier_status("small")).rejected == 4
        assert answer.tier == "small" and answer.text
    finally:
        await mesh.stop()


async def _five_queued_behind_a_held_slot(
    mesh: Mesh, client: AsyncRouterClient
) -> tuple[asyncio.Task[Any], list[asyncio.Task[Any]]]:
    """small's one slot held by a long chat and five short chats queued behind it; by its own
    estimate (an unmeasured 1 s per hand-over) a sixth would wait 6 s. Returns the holder and
    the five."""
    holder = await _hold_slot(client, mesh, "small")
    waiters = [asyncio.create_task(client.chat("Hi", max_tokens=2, timeout=60)) for _ in range(5)]
    while (status := await mesh.tier_status("small")).queued < 5:
        await asyncio.sleep(0.02)
    assert status.expected_wait_ms == pytest.approx(6000.0)
    return holder, waiters


async def test_a_tier_whose_reported_wait_is_past_its_limit_is_full_to_the_router(
    tmp_path: Path,
) -> None:
    """small's one slot held and five chats queued: by its own estimate (an unmeasured 1 s per
    hand-over) a sixth would wait 6 s, past the 5 s it queues a request for. Its load report
    says so (expected_wait_ms, max_wait_ms), and the router refuses the sixth itself, at once,
    sending small nothing; the queued five are answered once the slot is free."""
    options = one_slot_small(max_queued=8)
    options["router_options"]["load_watch_interval_ms"] = 50
    mesh = await start_mesh(tmp_path, **options)
    try:
        idle = await mesh.tier_status("small")
        assert (idle.expected_wait_ms, idle.max_wait_ms) == (0.0, 5000.0)
        async with AsyncRouterClient(mesh.address) as client:
            holder, waiters = await _five_queued_behind_a_held_slot(mesh, client)
            while not ((load := mesh.router.watcher.loads["small"]) and load.wait_too_long):
                await asyncio.sleep(0.01)
            with pytest.raises(ChatError) as refused:
                await client.chat("Hi", max_tokens=2, timeout=30)
            holder.cancel()
            answers = await asyncio.gather(*waiters)
        error = refused.value
        assert error.code == "RESOURCE_EXHAUSTED", error
        assert error.message.startswith(
            "every tier full: small full (expected wait 6.00 s over its 5.00 s limit"
        ), error.message
        assert error.retry_after_s is not None and error.retry_after_s > 0
        assert (await mesh.tier_status("small")).rejected == 0  # small never saw it
        assert all(answer.tier == "small" and answer.text for answer in answers)
    finally:
        await mesh.stop()


async def test_a_tier_with_a_longer_max_wait_queues_what_the_default_refuses(
    tmp_path: Path,
) -> None:
    """The same six chats on a small tier configured with max_wait_s = 8: the sixth, expected
    to wait 6 s, is queued (by the tier's report the router sees room) and answered too."""
    options = one_slot_small(max_queued=8)
    options["tier_options"]["max_wait_s"] = 8.0
    options["router_options"]["load_watch_interval_ms"] = 50
    mesh = await start_mesh(tmp_path, **options)
    try:
        idle = await mesh.tier_status("small")
        assert (idle.expected_wait_ms, idle.max_wait_ms) == (0.0, 8000.0)
        async with AsyncRouterClient(mesh.address) as client:
            holder, waiters = await _five_queued_behind_a_held_slot(mesh, client)
            await asyncio.sleep(0.2)  # the router's load watch has seen it (every 50 ms)
            sixth = asyncio.create_task(client.chat("Hi", max_tokens=2, timeout=60))
            while (await mesh.tier_status("small")).queued < 6:
                await asyncio.sleep(0.02)
            holder.cancel()
            answers = await asyncio.gather(*waiters, sixth)
        assert all(answer.tier == "small" and answer.text for answer in answers)
        assert (await mesh.tier_status("small")).rejected == 0
    finally:
        await mesh.stop()
