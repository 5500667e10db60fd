"""Per-token log-probabilities (`sampling.top_logprobs`) from real tiers over gRPC: the built-in
small model batched and decoding alone, greedy and sampled, cut by a stop sequence; an echo
tier; and through the router to the SDK, per revision of a progressive chat. The entries'
texts make the streamed text, each entry's log-probability is its token's, and its
alternatives are the most likely tokens, most likely first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, DeltaEvent, FinalEvent, event_to_json
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.tier.echo_engine import ECHO_LOGPROB
from services.tier.server import TierServer, start_tier
from tests.integration.mesh import Mesh, start_mesh

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is your return policy?"
ANSWER = "You can return any unused item within 30 days of delivery for a full refund."


async def _tier(**options: object) -> TierServer:
    model = ROOT / "services" / "tier_small" / "model"
    config = {"name": "small", "model_path": str(model), "tokens_per_chunk": 4, **options}
    return await start_tier(build_config(TierConfig, config))


@pytest.fixture(params=[True, False], ids=["batched", "alone"])
async def tier(request: pytest.FixtureRequest) -> AsyncIterator[TierServer]:
    server = await _tier(batching=request.param)
    yield server
    await server.stop(0)


async def generate(
    tier: TierServer, most: int = 40, **sampling: object
) -> list[tier_pb2.GenerateChunk]:
    request = tier_pb2.GenerateRequest(
        request_id="logprobs",
        max_tokens=most,
        messages=[common_pb2.ChatMessage(role="user", content=QUESTION)],
        sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
    )
    async with grpc.aio.insecure_channel(tier.address) as channel:
        return [c async for c in tier_pb2_grpc.TierServiceStub(channel).Generate(request)]


def entries(chunks: list[tier_pb2.GenerateChunk]) -> list[common_pb2.TokenLogprob]:
    return [e for c in chunks for e in c.token_logprobs]


async def test_each_token_with_its_likeliest_alternatives(tier: TierServer) -> None:
    chunks = await generate(tier, top_logprobs=3)
    assert "".join(c.text for c in chunks) == ANSWER  # greedy output unchanged
    for chunk in chunks:  # no stop: a chunk's entries are its tokens, and make its text
        assert len(chunk.token_logprobs) == len(chunk.token_ids)
        assert "".join(e.text for e in chunk.token_logprobs) == chunk.text
        for token, logprob, entry in zip(
            chunk.token_ids, chunk.logprobs, chunk.token_logprobs, strict=True
        ):
            assert entry.logprob == pytest.approx(logprob)
            assert len(entry.top) == 3
            assert [t.logprob for t in entry.top] == sorted(
                (t.logprob for t in entry.top), reverse=True
            )
            assert entry.top[0].token_id == token  # greedy: the chosen token is the likeliest
            assert entry.top[0].logprob == pytest.approx(entry.logprob)
            assert len({t.token_id for t in entry.top}) == 3
    assert [e.text for e in entries(chunks)][:3] == ["You", " can", " return"]
    assert entries(chunks)[0].top[0].text == "You"


async def test_no_entries_unless_asked_and_no_alternatives_at_zero(tier: TierServer) -> None:
    assert entries(await generate(tier)) == []
    bare = await generate(tier, top_logprobs=0)
    assert "".join(e.text for e in entries(bare)) == ANSWER
    assert all(not e.top for e in entries(bare))


async def test_sampled_tokens_carry_their_own_logprob(tier: TierServer) -> None:
    chunks = await generate(tier, temperature=1.5, seed=11, top_logprobs=2)
    text = "".join(c.text for c in chunks)
    assert "".join(e.text for e in entries(chunks)) == text
    logprobs = [p for c in chunks for p in c.logprobs]
    assert [e.logprob for e in entries(chunks)] == pytest.approx(logprobs)
    for entry in entries(chunks):
        assert entry.logprob <= entry.top[0].logprob + 1e-5


async def test_entries_end_with_the_text_at_a_stop_sequence(tier: TierServer) -> None:
    chunks = await generate(tier, top_logprobs=1, stop=["30 days"])
    text = "".join(c.text for c in chunks)
    assert text == "You can return any unused item within "
    assert "".join(e.text for e in entries(chunks)) == text
    assert len(entries(chunks)) < sum(len(c.token_ids) for c in chunks)  # none past the stop


async def test_too_many_alternatives_are_refused_by_field() -> None:
    server = await _tier()
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await generate(server, top_logprobs=21)
    finally:
        await server.stop(0)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = parse_status_details(refused.value.trailing_metadata()).field_violations
    assert [name for name, _ in violations] == ["sampling.top_logprobs"]


async def test_an_echo_tier_lists_each_word() -> None:
    config = {"name": "small", "engine": "echo", "model_path": "unused", "echo_ttft_ms": 0.0}
    server = await start_tier(build_config(TierConfig, config))
    try:
        chunks = await generate(server, top_logprobs=5)
    finally:
        await server.stop(0)
    text = "".join(c.text for c in chunks)
    assert "".join(e.text for e in entries(chunks)) == text
    assert len(entries(chunks)) == 40
    for token, entry in zip([t for c in chunks for t in c.token_ids], entries(chunks), strict=True):
        assert entry.logprob == pytest.approx(ECHO_LOGPROB)
        assert [(t.token_id, t.text) for t in entry.top] == [(token, entry.text)]


@pytest.fixture
async def mesh(tiny_model_dir: Path) -> AsyncIterator[Mesh]:
    mesh = await start_mesh(tiny_model_dir)
    yield mesh
    await mesh.stop()


async def test_through_the_router_every_revision_lists_its_tokens(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        events = [
            e
            async for e in client.chat_stream(
                QUESTION,
                mode="progressive",
                progressive_gate="always",
                max_tokens=16,
                top_logprobs=2,
            )
        ]
        plain = [e async for e in client.chat_stream(QUESTION, mode="pinned", tier="small")]
    deltas = [e for e in events if isinstance(e, DeltaEvent)]
    revisions = {d.revision for d in deltas}
    assert revisions == {0, 1}
    for revision in revisions:
        mine = [d for d in deltas if d.revision == revision]
        text = "".join(d.text for d in mine)
        listed = [t for d in mine for t in d.token_logprobs]
        assert "".join(t.text for t in listed) == text
        assert all(len(t.top) == 2 and t.top[0].logprob >= t.top[1].logprob for t in listed)
    final = events[-1]
    assert isinstance(final, FinalEvent)
    assert all(not d.token_logprobs for d in plain if isinstance(d, DeltaEvent))
    line = event_to_json(deltas[0], 1.0)  # `tiermesh chat --json` adds them to delta lines
    assert line["token_logprobs"][0]["text"] == deltas[0].token_logprobs[0].text
    assert set(line["token_logprobs"][0]) == {"text", "logprob", "top"}
    assert "token_logprobs" not in event_to_json(
        next(d for d in plain if isinstance(d, DeltaEvent)), 1.0
    )


async def continue_after(
    tier: TierServer,
    chunks: list[tier_pb2.GenerateChunk],
    tokens: int,
    entries_had: int,
    most: int = 40,
    **sampling: object,
) -> list[tier_pb2.GenerateChunk]:
    """Another replica goes on after the first `tokens` tokens of `chunks`, the caller having
    the text of their first `entries_had` entries (the rest held back, as by a stop)."""
    ids = [t for c in chunks for t in c.token_ids][:tokens]
    logprobs = [p for c in chunks for p in c.logprobs][:tokens]
    had = sum(len(e.text) for e in entries(chunks)[:entries_had])
    request = tier_pb2.GenerateRequest(
        request_id="continued",
        max_tokens=most,
        messages=[common_pb2.ChatMessage(role="user", content=QUESTION)],
        sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
        continue_token_ids=ids,
        continue_text_chars=had,
        continue_logprobs=logprobs,
    )
    async with grpc.aio.insecure_channel(tier.address) as channel:
        return [c async for c in tier_pb2_grpc.TierServiceStub(channel).Generate(request)]


async def test_a_continuation_lists_the_held_back_tokens_first(tier: TierServer) -> None:
    whole = await generate(tier, top_logprobs=2)
    listed = entries(whole)
    rest = await continue_after(tier, whole, tokens=6, entries_had=4, top_logprobs=2)
    again = entries(rest)
    # tokens 5 and 6 were generated but their text held back: they come first, with their
    # log-probabilities and no alternatives; then the new tokens, with theirs
    assert [(e.text, e.logprob, len(e.top)) for e in again[:2]] == [
        (e.text, pytest.approx(e.logprob), 0) for e in listed[4:6]
    ]
    assert [e.text for e in again[2:]] == [e.text for e in listed[6:]]
    assert all(len(e.top) == 2 for e in again[2:])
    text = "".join(c.text for c in rest)
    assert "".join(e.text for e in again) == text
    assert "".join(e.text for e in listed[:4]) + text == ANSWER


async def test_a_continuation_with_nothing_left_to_decode_lists_the_held_tokens() -> None:
    server = await _tier()
    try:
        whole = await generate(server, top_logprobs=1, most=8)  # cut by length: no EOS
        assert whole[-1].finish_reason == "length"
        rest = await continue_after(server, whole, 8, 5, top_logprobs=1, most=8)
    finally:
        await server.stop(0)
    assert len(rest) == 1 and not rest[0].token_ids and rest[0].finish_reason == "length"
    assert [e.text for e in rest[0].token_logprobs] == [e.text for e in entries(whole)[5:]]
    assert "".join(e.text for e in rest[0].token_logprobs) == rest[0].text


async def test_an_echo_continuation_lists_the_held_back_words_first() -> None:
    config = {"name": "small", "engine": "echo", "model_path": "unused", "echo_ttft_ms": 0.0}
    server = await start_tier(build_config(TierConfig, config))
    try:
        whole = await generate(server, top_logprobs=1)
        rest = await continue_after(server, whole, 6, 4, top_logprobs=1)
    finally:
        await server.stop(0)
    listed, again = entries(whole), entries(rest)
    assert [e.text for e in again] == [e.text for e in listed[4:]]
    assert [len(e.top) for e in again[:2]] == [0, 0] and all(len(e.top) == 1 for e in again[2:])
    assert "".join(e.text for e in again) == "".join(c.text for c in rest)
