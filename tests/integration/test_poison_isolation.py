"""Poison isolation on a real tier server (the tiny GPT-2): sampling parameters out of their
documented ranges are refused with INVALID_ARGUMENT naming the field, at the tier and at the
router; and one request whose logits turn non-finite in the middle of a batch fails alone, with
INVALID_ARGUMENT naming the cause (not INTERNAL: the same request would overflow the model on
any tier), while the requests batched with it finish with their usual answers.

After validation no request can make the tiny model's logits non-finite, so the poison row is
forced through the batch scheduler's logits transform (a torch engine built with
`logits_transform=`), which sets that row's logits to NaN the way an overflowing row would; the
detection and isolation are the real ones.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
import torch
from tiermesh.client import AsyncRouterClient, ChatError
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.tier.prepared_request import PreparedRequest
from services.tier.server import TierServer, start_tier
from services.tier.torch_engine import TorchEngine
from tests.integration.mesh import Mesh, start_mesh

CANARIES = [
    "What is your return policy?",
    "How much does the blue kettle cost?",
    "Hello, thank you",
    "The total for 2 mugs",
]


def _config(model: Path) -> TierConfig:
    return TierConfig(name="small", model_path=model, max_running=5, max_queued=4, max_tokens=64)


@pytest.fixture
async def tier(tiny_model_dir: Path) -> AsyncIterator[TierServer]:
    server = await start_tier(_config(tiny_model_dir))
    yield server
    await server.stop()


class Poison:
    """The scheduler's logits transform here: after a few good tokens, the "poison" request's
    row gets NaN logits, once it shares a forward pass with others; every other row is left as
    it is."""

    def __init__(self) -> None:
        self.steps = 0  # passes the poison request has been in
        self.batch_at_poison: list[int] = []  # rows of each pass it was poisoned in

    def __call__(self, requests: Sequence[PreparedRequest], logits: torch.Tensor) -> torch.Tensor:
        rows = [row for row, prepared in enumerate(requests) if prepared.request_id == "poison"]
        if not rows:
            return logits
        self.steps += 1
        # a few good tokens first, then it fails in the middle of a batch with others
        if self.steps < 4 or len(requests) < 2:
            return logits
        self.batch_at_poison.append(len(requests))
        logits = logits.clone()
        logits[rows] = float("nan")
        return logits


@pytest.fixture
def poison() -> Poison:
    return Poison()


@pytest.fixture
async def poisoned_tier(tiny_model_dir: Path, poison: Poison) -> AsyncIterator[TierServer]:
    config = _config(tiny_model_dir)
    server = await start_tier(config, engine=TorchEngine(config, logits_transform=poison))
    yield server
    await server.stop()


async def _generate(
    stub: tier_pb2_grpc.TierServiceStub, request_id: str, prompt: str, max_tokens: int = 24
) -> list[int]:
    request = tier_pb2.GenerateRequest(request_id=request_id, prompt=prompt, max_tokens=max_tokens)
    tokens: list[int] = []
    async for chunk in stub.Generate(request):
        tokens.extend(chunk.token_ids)
    return tokens


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": 1e-40}, "sampling.temperature"),
        ({"temperature": 0.01}, "sampling.temperature"),
        ({"temperature": 2.5}, "sampling.temperature"),
        ({"temperature": math.nan}, "sampling.temperature"),
        ({"temperature": 1.0, "top_p": 1.5}, "sampling.top_p"),
        ({"temperature": 1.0, "top_p": math.inf}, "sampling.top_p"),
        ({"temperature": 1.0, "top_k": 1_000_000}, "sampling.top_k"),
    ],
)
async def test_the_tier_refuses_sampling_out_of_range(
    tier: TierServer, sampling: dict[str, float], field: str
) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        request = tier_pb2.GenerateRequest(
            request_id="bad",
            prompt="Hi",
            max_tokens=4,
            sampling=common_pb2.SamplingParams(**sampling),  # type: ignore[arg-type]
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Generate(request):
                pass
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = parse_status_details(refused.value.trailing_metadata())
    assert [name for name, _ in details.field_violations] == [field]


async def test_the_lowest_documented_temperature_is_served(tier: TierServer) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        request = tier_pb2.GenerateRequest(
            request_id="cold",
            prompt="Hi",
            max_tokens=6,
            sampling=common_pb2.SamplingParams(temperature=0.05, top_p=0.9, top_k=5, seed=7),
        )
        chunks = [chunk async for chunk in stub.Generate(request)]
    assert chunks[-1].finish_reason in ("stop", "length")


async def test_one_poisoned_row_fails_alone(poisoned_tier: TierServer, poison: Poison) -> None:
    engine = poisoned_tier.engine
    assert isinstance(engine, TorchEngine) and engine._scheduler is not None
    async with grpc.aio.insecure_channel(poisoned_tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        alone = [await _generate(stub, f"alone-{i}", p) for i, p in enumerate(CANARIES)]
        canaries = [_generate(stub, f"canary-{i}", p) for i, p in enumerate(CANARIES)]
        poisoned = _generate(stub, "poison", CANARIES[0], 64)
        results = await asyncio.gather(*canaries, poisoned, return_exceptions=True)
    assert results[:-1] == alone  # every canary: its answer, token for token
    failure = results[-1]
    assert isinstance(failure, grpc.aio.AioRpcError)
    assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT  # neither retried nor a tier fault
    assert "non-finite logits" in (failure.details() or "")
    assert not parse_status_details(failure.trailing_metadata()).field_violations
    batch_at_poison = poison.batch_at_poison
    assert batch_at_poison and batch_at_poison[0] > 1  # it really shared a step with others
    load = engine.load()
    assert load.running == 0 and load.kv_pool_used_tokens == 0
    assert engine._pool is not None and engine._pool.free_slots == 5


@pytest.fixture
async def mesh(tiny_model_dir: Path) -> AsyncIterator[Mesh]:
    mesh = await start_mesh(tiny_model_dir)
    yield mesh
    await mesh.stop()


async def test_the_router_refuses_sampling_out_of_range(mesh: Mesh) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        with pytest.raises(ChatError) as refused:
            await client.chat("Hi", temperature=1e-40)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert [name for name, _ in refused.value.details.field_violations] == ["sampling.temperature"]
