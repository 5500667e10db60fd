"""Continuous batching in the torch engine, on a real tiny GPT-2 model: batched greedy output
equals batch-1 output, cancelled requests free their slot, a full pool sheds."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from services.common.config import TierConfig
from services.common.errors import Overloaded
from services.tier.decode import decode_steps
from services.tier.engine import GenerationRequest, Sampling
from services.tier.model_loading import load_causal_lm
from services.tier.tokenizer_loading import encode_prompt
from services.tier.torch_engine import TorchEngine
from tests.engine_prompts import PROMPTS


async def _engine(model_dir: Path, **options: object) -> TorchEngine:
    config = TierConfig(name="small", model_path=model_dir, **options)  # type: ignore[arg-type]
    engine = TorchEngine(config)
    await engine.start()
    return engine


async def _collect(engine: TorchEngine, request: GenerationRequest, delay_s: float = 0.0):
    await asyncio.sleep(delay_s)
    tokens: list[int] = []
    finish = None
    async for chunk in engine.generate(request):
        tokens.extend(chunk.token_ids)
        finish = chunk.finish_reason or finish
    return tokens, finish


async def test_batched_greedy_output_equals_batch_one(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, max_running=4, max_queued=8, tokens_per_chunk=3)
    assert engine.batching
    try:
        requests = [
            GenerationRequest(request_id=f"r{i}", prompt=p, max_tokens=12 + 5 * i)
            for i, p in enumerate(PROMPTS)
        ]
        # Staggered arrivals: requests join a batch that is already decoding.
        results = await asyncio.gather(
            *(_collect(engine, r, delay_s=0.004 * i) for i, r in enumerate(requests))
        )
    finally:
        await engine.shutdown()
    loaded = load_causal_lm(tiny_model_dir)
    for request, (tokens, finish) in zip(requests, results, strict=True):
        alone = [
            t
            for t, _, _ in decode_steps(
                loaded.model,
                encode_prompt(loaded.tokenizer, request.prompt),
                max_new_tokens=request.max_tokens,
                sampling=Sampling(),
                eos_token_ids=loaded.eos_token_ids,
            )
        ]
        assert tokens == alone, request.prompt
        assert finish in ("stop", "length")
    assert engine._scheduler is not None and engine._scheduler.steps > 0
    # More tokens were decoded than steps taken: requests really shared steps.
    assert engine._scheduler.batched_tokens > engine._scheduler.steps


async def test_cancelled_request_frees_its_slot(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, max_running=2, max_queued=0, max_tokens=400)
    try:
        stream = engine.generate(GenerationRequest(request_id="long", prompt="Hi", max_tokens=400))
        async with contextlib.aclosing(stream):
            async for _ in stream:
                break
        assert engine._pool is not None
        for _ in range(200):
            if engine._pool.free_slots == 2:
                break
            await asyncio.sleep(0.01)
        assert engine._pool.free_slots == 2
        load = engine.load()
        assert (load.running, load.kv_pool_used_tokens) == (0, 0)
        assert load.completed == 0
        tokens, finish = await _collect(
            engine, GenerationRequest(request_id="next", prompt="Hi", max_tokens=5)
        )
        assert len(tokens) == 5 and finish == "length"
    finally:
        await engine.shutdown()


async def test_full_pool_sheds_with_overloaded(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, max_running=1, max_queued=1, max_tokens=400)
    try:
        first = engine.generate(GenerationRequest(request_id="a", prompt="Hi", max_tokens=400))
        async with contextlib.aclosing(first):
            await first.__anext__()  # holds the only pool slot
            waiting = asyncio.create_task(
                _collect(engine, GenerationRequest(request_id="b", prompt="Hi", max_tokens=3))
            )
            await asyncio.sleep(0.01)
            assert engine.load().queued == 1
            with pytest.raises(Overloaded, match="tier at capacity"):
                await _collect(engine, GenerationRequest(request_id="c", prompt="Hi", max_tokens=3))
        tokens, _ = await waiting  # the queued request ran once the slot was free
        assert len(tokens) == 3
        assert engine.load().rejected == 1
    finally:
        await engine.shutdown()


async def test_pool_is_allocated_at_start_and_reported(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, max_running=3, kv_max_len=128)
    try:
        load = engine.load()
        # 2 layers x (keys + values) x 3 slots x 128 positions x 64 wide x 4 bytes
        assert load.kv_pool_capacity_tokens == 3 * 128
        assert load.kv_pool_bytes == 2 * 2 * 3 * 128 * 64 * 4
        assert load.weights_bytes > 0 and load.kv_pool_used_tokens == 0
        await _collect(engine, GenerationRequest(request_id="a", prompt="Hi", max_tokens=8))
        assert engine.load().kv_pool_peak_tokens >= 8
        with pytest.raises(Exception, match="context of 128"):
            await _collect(engine, GenerationRequest(request_id="b", prompt="Hi", max_tokens=200))
    finally:
        await engine.shutdown()
