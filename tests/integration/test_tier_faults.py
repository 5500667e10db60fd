"""Tier faults with real processes: three tiers and a router, each `python -m ...` on its own
port; a tier is SIGKILLed (before or in the middle of an answer) or SIGSTOPped (hung), and the
tests check what the client saw, event by event and token by token.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client import (
    AsyncRouterClient,
    ChatError,
    ChatResult,
    DeltaEvent,
    Event,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
)
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.tiers import TIER_NAMES
from tests.integration.processes import FAST_FAULTS_ROUTER, ProcessMesh, start_process_mesh
from tests.tiny_model import build_tiny_model

PROMPT = "What is your return policy?"  # the interim heuristic routes it to small
TIERS = {"max_tokens": 400}
EVENTUALLY_S = 20.0  # bound on waiting for the router to notice a change (not a measurement)
pytestmark = pytest.mark.timeout(300)  # four processes start per test on a busy 2-core machine


@pytest.fixture
async def mesh(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[ProcessMesh]:
    models = dict.fromkeys(TIER_NAMES, tiny_model_dir)
    started = await start_process_mesh(
        tmp_path / "mesh", models, tier_options=TIERS, router_options=FAST_FAULTS_ROUTER
    )
    yield started
    started.stop()


async def answering(mesh: ProcessMesh, names: tuple[str, ...]) -> str:
    """Which of the tier processes `names` is running a request now."""
    for name in names:
        async with grpc.aio.insecure_channel(mesh.tiers[name].address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            status = await stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=5)
        if status.running:
            return name
    raise AssertionError(f"none of {names} is running a request")


def route_of(result: ChatResult) -> RouteEvent:
    route = result.events[0]
    assert isinstance(route, RouteEvent)
    return route


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


def assert_one_clean_revision(result: ChatResult) -> None:
    """The client saw one revision, whole, with no error: any retry was unseen."""
    assert [e.revision for e in result.events if isinstance(e, RevisionStartEvent)] == [0]
    ends = [e for e in result.events if isinstance(e, RevisionEndEvent)]
    assert [(e.revision, e.error) for e in ends] == [(0, "")]
    deltas = [e.text for e in result.events if isinstance(e, DeltaEvent)]
    assert "".join(deltas) == result.text


async def routed_until(client: AsyncRouterClient, predicate: str, wanted: bool) -> ChatResult:
    """Sends routed chats until one's route reason names `predicate` (or no longer does)."""
    deadline = asyncio.get_running_loop().time() + EVENTUALLY_S
    while True:
        result = await client.chat(PROMPT, max_tokens=8, timeout=30)
        if (predicate in route_of(result).reason) == wanted:
            return result
        assert asyncio.get_running_loop().time() < deadline, route_of(result).reason
        await asyncio.sleep(0.1)


async def test_killed_small_tier_routed_chats_are_answered_by_the_fallback(
    mesh: ProcessMesh,
) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        # small serves routed chats (on a busy machine its first load report can come after the
        # router's first chat, which then goes to the fallback: wait for a report)
        before = await routed_until(client, "fallback", wanted=False)
        assert before.tier == "small", before.final.reason
        small = mesh.tiers["small"]
        small.signal(signal.SIGKILL)
        small.process.wait()
        # at once, before the router has noticed: routed there, retried unseen on medium
        results = [await client.chat(PROMPT, max_tokens=8, timeout=30) for _ in range(5)]
        # then the route itself names the fallback
        results.append(await routed_until(client, "fallback medium", wanted=True))
        results += [await client.chat(PROMPT, max_tokens=8, timeout=30) for _ in range(10)]
    for result in results:
        assert result.tier == "medium", result.final.reason
        assert_one_clean_revision(result)
        route, final = route_of(result), result.final
        named = "fallback medium" in route.reason or "retried on medium" in final.reason
        assert named, (route.reason, final.reason)
    for result in results[-11:]:
        assert "small load stream broken (UNAVAILABLE)" in route_of(result).reason


async def test_hung_tier_fails_its_pinned_chat_and_routing_leaves_it_until_it_resumes(
    mesh: ProcessMesh,
) -> None:
    small = mesh.tiers["small"]
    async with AsyncRouterClient(mesh.address) as client:
        small.signal(signal.SIGSTOP)
        try:
            # no client deadline: the stall timeout ends the call; the guard only stops a hang
            with pytest.raises(ChatError) as caught:
                await asyncio.wait_for(
                    client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8), 30
                )
            assert caught.value.code == "UNAVAILABLE"
            assert "stalled: no first chunk from tier small" in caught.value.message
            # routed there before the router sees it silent: stalls, retried unseen on medium
            routed = await client.chat(PROMPT, max_tokens=8, timeout=30)
            assert routed.tier == "medium"
            reasons = route_of(routed).reason + routed.final.reason
            assert "fallback medium" in reasons or "retried on medium" in reasons, reasons
            assert_one_clean_revision(routed)
        finally:
            small.signal(signal.SIGCONT)
        back = await routed_until(client, "fallback", wanted=False)
        assert back.tier == "small"
        pinned = await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8, timeout=30)
        assert pinned.tier == "small"


async def test_tier_killed_mid_answer_is_continued_by_the_next_tier_with_no_token_lost(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # small and medium run the same, slower model: a greedy answer is the same from either,
    # and long enough to be cut in the middle
    slow = build_tiny_model(tmp_path / "slow-model", layers=4, width=256)
    models = {"small": slow, "medium": slow, "large": tiny_model_dir}
    # small's only fallback is medium: failover orders fallbacks by load, and a medium whose
    # first load report is late on a busy machine would otherwise come after large
    only_medium = {
        **FAST_FAULTS_ROUTER,
        "fallback": {"small": "medium", "medium": "small", "large": "medium"},
    }
    mesh = await start_process_mesh(
        tmp_path / "mesh", models, tier_options=TIERS, router_options=only_medium
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            events: list[Event] = []
            # pinned to small (no routing decision in the way), then killed mid-answer
            options = {"mode": "pinned", "tier": "small", "max_tokens": 300, "timeout": 60}
            async for event in client.chat_stream(PROMPT, **options):
                events.append(event)
                if isinstance(event, DeltaEvent) and len(events) == 3:
                    mesh.tiers["small"].signal(signal.SIGKILL)
            reference = await client.chat(
                PROMPT, mode="pinned", tier="medium", max_tokens=300, timeout=60
            )
    finally:
        mesh.stop()
    starts = [e for e in events if isinstance(e, RevisionStartEvent)]
    assert [(s.revision, s.tier, s.replaces) for s in starts] == [
        (0, "small", None),
        (1, "medium", 0),
    ], kinds(events)
    ends = [e for e in events if isinstance(e, RevisionEndEvent)]
    assert [(e.revision, e.finish_reason) for e in ends] == [(0, "error"), (1, "length")]
    assert ends[0].error.startswith("UNAVAILABLE")
    final = events[-1]
    assert isinstance(final, FinalEvent) and (final.revision, final.tier) == (1, "medium")
    broken = "".join(e.text for e in events if isinstance(e, DeltaEvent) and e.revision == 0)
    answer = [e for e in events if isinstance(e, DeltaEvent) and e.revision == 1]
    # token by token: the answer is its revision's deltas, equal to the uninterrupted answer,
    # and the text the client already had is kept whole (the same greedy tokens)
    assert "".join(e.text for e in answer) == final.text == reference.text
    assert [t for e in answer for t in e.token_ids] == [
        t for e in reference.events if isinstance(e, DeltaEvent) for t in e.token_ids
    ]
    assert 0 < len(broken) < len(final.text) and final.text.startswith(broken)
    assert starts[1].kept_prefix_chars == len(broken)
    assert "small failed after" in final.reason and "medium went on as revision 1" in final.reason


async def test_replica_killed_mid_answer_is_continued_by_the_other_replica(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    slow = build_tiny_model(tmp_path / "slow-model", layers=4, width=256)
    models = {"small": slow, "medium": tiny_model_dir, "large": tiny_model_dir}
    mesh = await start_process_mesh(
        tmp_path / "mesh",
        models,
        tier_options=TIERS,
        router_options=FAST_FAULTS_ROUTER,
        replicas={"small": 2},
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            reference = await client.chat(
                PROMPT, mode="pinned", tier="small", max_tokens=300, timeout=60
            )
            events: list[Event] = []
            async for event in client.chat_stream(  # with per-token detail: it goes on too
                PROMPT, mode="pinned", tier="small", max_tokens=300, timeout=60, top_logprobs=2
            ):
                events.append(event)
                if isinstance(event, DeltaEvent) and len(events) == 3:
                    mesh.tiers[await answering(mesh, ("small", "small-2"))].signal(signal.SIGKILL)
            after = [
                await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=8, timeout=30)
                for _ in range(4)
            ]
    finally:
        mesh.stop()
    starts = [e for e in events if isinstance(e, RevisionStartEvent)]
    final = events[-1]
    assert isinstance(final, FinalEvent) and final.tier == "small", kinds(events)
    # one revision, one unbroken text: the other replica prefilled the tokens sent and went on,
    # so the greedy answer is the unbroken one, token by token
    assert [(s.revision, s.tier) for s in starts] == [(0, "small")]
    answer = [e for e in events if isinstance(e, DeltaEvent)]
    assert "".join(e.text for e in answer) == final.text == reference.text
    tokens = [t for e in answer for t in e.token_ids]
    assert tokens == [t for e in reference.events if isinstance(e, DeltaEvent) for t in e.token_ids]
    listed = [t for e in answer for t in e.token_logprobs]  # one per token, making the text
    assert len(listed) == len(tokens) and "".join(t.text for t in listed) == final.text
    assert all(len(t.top) == 2 for t in listed)
    assert "another small replica continued revision 0" in final.reason, final.reason
    for result in after:  # the other replica serves the pinned chats
        assert result.tier == "small"
