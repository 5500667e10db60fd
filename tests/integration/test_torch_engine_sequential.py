"""The torch engine without batching (`batching = false`): each request decodes on its own
worker thread and its chunks cross to the event loop through a ChunkChannel. Same output as
the decode loop alone, usage on the last chunk, early close stops the work."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from services.common.config import TierConfig
from services.tier.decode import decode_steps
from services.tier.engine import GenerationChunk, GenerationRequest, Sampling
from services.tier.model_loading import load_causal_lm
from services.tier.tokenizer_loading import encode_prompt
from services.tier.torch_engine import TorchEngine


async def _engine(model_dir: Path, **options: object) -> TorchEngine:
    config = TierConfig(name="small", model_path=model_dir, batching=False, **options)  # type: ignore[arg-type]
    engine = TorchEngine(config)
    await engine.start()
    assert not engine.batching
    return engine


async def _collect(engine: TorchEngine, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in engine.generate(request)]


async def test_sequential_output_equals_the_decode_loop(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, max_running=2, tokens_per_chunk=3)
    prompts = ["What is your return policy?", "Hi", "The total for 2 mugs"]
    requests = [
        GenerationRequest(request_id=f"s{i}", prompt=p, max_tokens=10)
        for i, p in enumerate(prompts)
    ]
    try:
        results = await asyncio.gather(*(_collect(engine, r) for r in requests))
        load = engine.load()
    finally:
        await engine.shutdown()
    loaded = load_causal_lm(tiny_model_dir)
    for request, chunks in zip(requests, results, strict=True):
        prompt = encode_prompt(loaded.tokenizer, request.prompt)
        alone = [
            t
            for t, _, _ in decode_steps(
                loaded.model,
                prompt,
                max_new_tokens=request.max_tokens,
                sampling=Sampling(),
                eos_token_ids=loaded.eos_token_ids,
            )
        ]
        assert [t for c in chunks for t in c.token_ids] == alone
        assert len(chunks[0].token_ids) == 1  # the first token alone, then 3 at a time
        assert all(len(c.token_ids) <= 3 for c in chunks)
        assert chunks[-1].finish_reason in ("stop", "length")
        usage = chunks[-1].usage
        assert usage is not None and usage.completion_tokens == len(alone)
        assert usage.prompt_tokens == len(prompt)
    assert load.completed == 3 and load.kv_pool_used_tokens == 0
    assert load.kv_pool_peak_tokens > 0 and load.ttft_ms_p99 >= load.ttft_ms_p50 > 0


async def test_leaving_early_stops_the_worker(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, max_running=1, max_queued=0, max_tokens=400)
    try:
        stream = engine.generate(GenerationRequest(request_id="long", prompt="Hi", max_tokens=400))
        async with contextlib.aclosing(stream):
            async for _ in stream:
                break
        load = engine.load()
        assert (load.running, load.completed, load.kv_pool_used_tokens) == (0, 0, 0)
        chunks = await _collect(
            engine, GenerationRequest(request_id="next", prompt="Hi", max_tokens=4)
        )
        assert sum(len(c.token_ids) for c in chunks) == 4
        assert chunks[-1].finish_reason == "length"
    finally:
        await engine.shutdown()
