"""Stop sequences at a real tier (the built-in small model, greedy, streamed over gRPC): the
answer ends just before the first stop sequence, finished by "stop", no chunk ever carries the
stop sequence, and the tier stops generating there; bad stop lists are refused by field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig, build_config
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
