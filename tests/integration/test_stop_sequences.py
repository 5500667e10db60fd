"""Stop sequences at a real tier (the built-in small model, greedy, streamed over gRPC): the
answer ends just before the first stop sequence, finished by "stop", no chunk ever carries the
stop sequence, and the tier stops generating there; bad stop lists are refused by field. And an
echo engine's continuations (another replica going on with a broken stream): the text held back
before the break still reaches the caller, and is matched against the stop sequences too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.tier.echo_engine import EchoEngine, echo_answer, echo_text
from services.tier.engine import GenerationRequest, Sampling
from services.tier.server import TierServer, start_tier

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is your return policy?"
ANSWER = "You can return any unused item within 30 days of delivery for a full refund."


@pytest.fixture
async def tier() -> AsyncIterator[TierServer]:
    model = ROOT / "services" / "tier_small" / "model"
    config = {"name": "small", "model_path": str(model), "tokens_per_chunk": 4}
    server = await start_tier(build_config(TierConfig, config))
    yield server
    await server.stop(0)


async def generate(tier: TierServer, *stops: str) -> list[tier_pb2.GenerateChunk]:
    request = tier_pb2.GenerateRequest(
        request_id="stops",
        max_tokens=40,
        messages=[common_pb2.ChatMessage(role="user", content=QUESTION)],
        sampling=common_pb2.SamplingParams(stop=list(stops)),
    )
    async with grpc.aio.insecure_channel(tier.address) as channel:
        return [c async for c in tier_pb2_grpc.TierServiceStub(channel).Generate(request)]


def text(chunks: list[tier_pb2.GenerateChunk]) -> str:
    return "".join(c.text for c in chunks)


async def test_the_answer_ends_before_the_stop_sequence(tier: TierServer) -> None:
    whole = await generate(tier)
    assert text(whole) == ANSWER  # the model's greedy answer, which the cases below cut
    cut = await generate(tier, "30 days", "refund")
    assert text(cut) == "You can return any unused item within "
    assert cut[-1].finish_reason == "stop"
    assert (cut[-1].stop_sequence, whole[-1].stop_sequence) == ("30 days", "")
    assert all("30" not in c.text for c in cut)
    # it stopped there: fewer tokens than the whole answer, at most one chunk past the stop
    generated = cut[-1].usage.completion_tokens
    assert generated == sum(len(c.token_ids) for c in cut)
    assert generated < whole[-1].usage.completion_tokens - 4


async def test_a_stop_sequence_that_never_comes_changes_nothing(tier: TierServer) -> None:
    whole = await generate(tier)
    same = await generate(tier, "PayPal", "refund!")  # "refund!" is held back at "refund"
    assert text(same) == text(whole)
    assert [c.finish_reason for c in same][-1] == whole[-1].finish_reason


@pytest.mark.parametrize(
    ("stops", "field"),
    [(["a", "b", "c", "d", "e"], "sampling.stop"), (["ok", ""], "sampling.stop[1]")],
)
async def test_bad_stop_lists_are_refused_by_field(
    tier: TierServer, stops: list[str], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await generate(tier, *stops)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = parse_status_details(refused.value.trailing_metadata()).field_violations
    assert [name for name, _ in violations] == [field]


async def _echo() -> EchoEngine:
    config = {"name": "small", "engine": "echo", "model_path": "unused", "tokens_per_chunk": 1}
    engine = EchoEngine(build_config(TierConfig, {**config, "echo_ttft_ms": 0.0}))
    await engine.start()
    return engine


def _echo_request(
    rid: str, stops: tuple[str, ...], ids: tuple[int, ...] = (), chars: int = 0, most: int = 12
) -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        prompt="hello there",
        max_tokens=most,
        sampling=Sampling(stop=stops),
        continue_ids=ids,
        continue_chars=chars,
    )


async def test_a_continued_stream_gets_the_text_held_back_before_the_break() -> None:
    """An echo tier's stream breaks after 4 tokens while it holds text back (it could begin the
    stop sequence); another replica continues it: the caller ends with the whole answer."""
    engine = await _echo()
    whole = echo_text(echo_answer(tuple(b"hello there"), 12))
    stop = " " + whole.split(" ")[4] + "ZZ"  # begins like the 4th word, never matches
    got, ids = "", ()
    async for chunk in engine.generate(_echo_request("a", (stop,))):
        got, ids = got + chunk.text, ids + chunk.token_ids
        if len(ids) == 4:
            break  # the replica died here
    assert len(got) < len(echo_text(list(ids)))  # the 4th word was held back
    rest = [c.text async for c in engine.generate(_echo_request("b", (stop,), ids, len(got)))]
    assert got + "".join(rest) == whole


async def test_a_continuation_with_nothing_left_to_decode_still_cuts_at_the_stop() -> None:
    """Every token was sent but the caller has the text of only the first 6 (the rest was held
    back when the stream broke): the continuation has nothing to decode, and the text it
    releases is matched against the stop sequences too."""
    engine = await _echo()
    ids = tuple(echo_answer(tuple(b"hello there"), 8))
    words = echo_text(list(ids)).split(" ")  # ['', 'of', 'support', ...]
    has = len(echo_text(list(ids[:6])))
    request = _echo_request("b", (" " + words[7],), ids, has, most=8)
    rest = [(c.text, c.finish_reason) async for c in engine.generate(request)]
    assert rest == [("", "stop")]
