"""A tier continues an answer another replica began (`continue_token_ids`): it streams only what
comes after the given tokens, and with greedy sampling the continued answer equals the unbroken
one token for token and character for character. Bad continuations are refused alone with
INVALID_ARGUMENT. Real tier servers (the tiny GPT-2 with continuous batching, and the echo
engine), called directly."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.tier.server import TierServer, start_tier
from tests.tiny_model import build_tiny_model

PROMPT = "What is your return policy?"
MAX_TOKENS = 20


@pytest.fixture(params=["torch", "echo"])
async def tier(request: pytest.FixtureRequest, tiny_model_dir: Path) -> AsyncIterator[TierServer]:
    fields = {"name": "small", "model_path": str(tiny_model_dir), "engine": request.param}
    server = await start_tier(build_config(TierConfig, fields))
    yield server
    await server.stop(0)


async def generate(
    tier: TierServer,
    continued: list[int] | None = None,
    chars: int | None = None,
    request_id: str = "r",
) -> list[tier_pb2.GenerateChunk]:
    request = tier_pb2.GenerateRequest(
        request_id=request_id,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        tokens_per_chunk=1,  # one token per chunk: the text a client had after k tokens is exact
        continue_token_ids=continued or [],
        continue_text_chars=chars,
    )
    async with grpc.aio.insecure_channel(tier.address) as channel:
        return [c async for c in tier_pb2_grpc.TierServiceStub(channel).Generate(request)]


async def test_a_continued_greedy_answer_equals_the_unbroken_one(tier: TierServer) -> None:
    whole = await generate(tier)
    ids = [t for chunk in whole for t in chunk.token_ids]
    text = "".join(chunk.text for chunk in whole)
    assert len(ids) >= 4, ids
    for k in (1, len(ids) // 2, len(ids) - 1):
        had = "".join(chunk.text for chunk in whole[:k])  # what the client had after k tokens
        rest = await generate(tier, ids[:k], len(had), request_id=f"r{k}")
        assert [t for chunk in rest for t in chunk.token_ids] == ids[k:], k
        assert had + "".join(chunk.text for chunk in rest) == text, k
        assert rest[-1].finish_reason == whole[-1].finish_reason
        assert rest[-1].usage.completion_tokens == len(ids) - k
        assert rest[-1].usage.prompt_tokens == whole[-1].usage.prompt_tokens + k


async def test_a_continuation_of_a_whole_answer_gets_its_last_chunk_at_once(
    tier: TierServer,
) -> None:
    # the stream broke after its last token but before its last chunk: all max_tokens are sent
    whole = await generate(tier)
    ids = [t for chunk in whole for t in chunk.token_ids]
    text = "".join(chunk.text for chunk in whole)
    assert whole[-1].finish_reason == "length" and len(ids) == MAX_TOKENS
    last = await generate(tier, ids, len(text), request_id="whole")
    assert [(c.token_ids, c.text, c.finish_reason) for c in last] == [([], "", "length")]
    assert last[0].usage.completion_tokens == 0
    assert last[0].usage.prompt_tokens == whole[-1].usage.prompt_tokens + MAX_TOKENS
    assert last[0].model == whole[-1].model


async def test_bad_continuations_are_refused_alone(tier: TierServer) -> None:
    whole = await generate(tier)
    ids = [t for chunk in whole for t in chunk.token_ids]
    bad = {
        "more than max_tokens": ([ids[0]] * (MAX_TOKENS + 1), None),
        "not in the vocabulary": ([ids[0], 10**9], None),
        "more characters than the tokens make": (ids[:2], 10_000),
        "characters without tokens": ([], 3),
    }
    healthy = asyncio.ensure_future(generate(tier, request_id="healthy"))
    for why, (continued, chars) in bad.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await generate(tier, continued, chars, request_id=why)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, why
        assert "continue_t" in (refused.value.details() or ""), why  # the field it names
    answer = await healthy  # a request running beside the refused ones is untouched
    assert [t for chunk in answer for t in chunk.token_ids] == ids


async def test_an_end_of_sequence_token_cannot_be_continued(tiny_model_dir: Path) -> None:
    fields = {"name": "small", "model_path": str(tiny_model_dir)}
    server = await start_tier(build_config(TierConfig, fields))
    try:
        eos = json.loads((tiny_model_dir / "config.json").read_text())["eos_token_id"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await generate(server, [eos])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "end-of-sequence" in (refused.value.details() or "")
    finally:
        await server.stop(0)


async def test_tokens_of_another_model_are_refused_and_the_first_chunk_names_the_model(
    tier: TierServer,
) -> None:
    whole = await generate(tier)
    ids = [t for chunk in whole for t in chunk.token_ids]
    serving = whole[-1].model
    assert whole[0].model == serving != ""  # a stream broken later still said whose tokens
    request = tier_pb2.GenerateRequest(
        request_id="other",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        continue_token_ids=ids[:2],
        continue_model="small/another-model",
    )
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            [c async for c in stub.Generate(request)]
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "small/another-model" in (refused.value.details() or "")
        assert serving in (refused.value.details() or "")
        request.continue_model = serving
        rest = [c async for c in stub.Generate(request)]
    assert [t for chunk in rest for t in chunk.token_ids] == ids[2:]


async def test_tokens_of_another_checkpoint_under_the_same_name_are_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # three replicas answering as small/<name>: one a copy of the checkpoint that generated the
    # tokens (elsewhere on disk), one other weights in a folder of the same name
    same = shutil.copytree(tiny_model_dir, tmp_path / "copy" / tiny_model_dir.name)
    other = build_tiny_model(tmp_path / "retrained" / tiny_model_dir.name, seed=1)
    servers = [
        await start_tier(build_config(TierConfig, {"name": "small", "model_path": str(path)}))
        for path in (tiny_model_dir, same, other)
    ]
    try:
        original, copy, retrained = servers
        whole = await generate(original)
        first = whole[0]
        assert (
            len(first.model_fingerprint) == 16
            and whole[-1].model_fingerprint == first.model_fingerprint
        )
        ids = [t for chunk in whole for t in chunk.token_ids]
        request = tier_pb2.GenerateRequest(
            request_id="continued",
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            continue_token_ids=ids[:2],
            continue_model=first.model,
            continue_model_fingerprint=first.model_fingerprint,
        )
        async with grpc.aio.insecure_channel(retrained.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            status = await stub.GetStatus(tier_pb2.GetStatusRequest())
            assert status.model_id == first.model  # the same name ...
            assert status.model_fingerprint not in ("", first.model_fingerprint)  # ... not weights
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                [c async for c in stub.Generate(request)]
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "continue_model_fingerprint" in (refused.value.details() or "")
        assert first.model_fingerprint in (refused.value.details() or "")
        async with grpc.aio.insecure_channel(copy.address) as channel:
            rest = [c async for c in tier_pb2_grpc.TierServiceStub(channel).Generate(request)]
        assert [t for chunk in rest for t in chunk.token_ids] == ids[2:]
    finally:
        for server in servers:
            await server.stop(0)
