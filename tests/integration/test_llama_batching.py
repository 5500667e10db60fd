"""Continuous batching for the Llama family in the torch engine, on tiny seeded random models
(Llama tied and untied, rope scaling, Qwen2, Mistral, all with grouped-query attention):
batched greedy output equals Hugging Face `generate` token for token, at batch 1 and with
streams joining a running batch; what the pool cannot reproduce decodes per request."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from services.common.config import TierConfig
from services.tier.engine import GenerationRequest
from services.tier.model_loading import LoadedModel, load_causal_lm
from services.tier.pooled_models import pooled_passes
from services.tier.tokenizer_loading import encode_prompt
from services.tier.torch_engine import TorchEngine
from tests.engine_prompts import PROMPTS
from tests.tiny_llama import build_tiny_llama, build_variant

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "llama-tied": {},
    "llama-untied-linear-rope": {
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    },
    "llama-llama3-rope": {"rope_parameters": LLAMA3_ROPE, "seed": 1},
    "qwen2-untied": {"model_type": "qwen2", "tie_word_embeddings": False, "seed": 2},
    "mistral": {"model_type": "mistral", "seed": 3},  # its sliding window (4096) covers a slot
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def llama_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Path:
    return build_variant(request.param, VARIANTS, tmp_path_factory, tiny_model_dir)


def hf_generate(loaded: LoadedModel, prompt: str, max_tokens: int) -> list[int]:
    """Greedy `generate` of one prompt, up to and including an end-of-sequence token."""
    ids = encode_prompt(loaded.tokenizer, prompt)
    eos = sorted(loaded.eos_token_ids)
    with torch.inference_mode():
        out = loaded.model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
        )
    return [int(t) for t in out[0, len(ids) :]]


async def _engine(model_dir: Path, **options: Any) -> TorchEngine:
    engine = TorchEngine(TierConfig(name="large", model_path=model_dir, **options))
    await engine.start()
    return engine


async def _collect(engine: TorchEngine, request: GenerationRequest, delay_s: float = 0.0):
    await asyncio.sleep(delay_s)
    tokens: list[int] = []
    async for chunk in engine.generate(request):
        tokens.extend(chunk.token_ids)
    return tokens


async def test_batch_one_equals_hf_generate(llama_dir: Path) -> None:
    engine = await _engine(llama_dir, max_running=1, max_queued=8)
    assert engine.batching
    try:
        requests = [
            GenerationRequest(request_id=f"r{i}", prompt=p, max_tokens=10)
            for i, p in enumerate(PROMPTS[:3])
        ]
        results = [await _collect(engine, r) for r in requests]
    finally:
        await engine.shutdown()
    loaded = load_causal_lm(llama_dir)
    for request, tokens in zip(requests, results, strict=True):
        assert tokens == hf_generate(loaded, request.prompt, request.max_tokens), request.prompt


async def test_streams_joining_a_running_batch_equal_hf_generate(llama_dir: Path) -> None:
    engine = await _engine(llama_dir, max_running=4, max_queued=8, tokens_per_chunk=3)
    try:
        requests = [
            GenerationRequest(request_id=f"r{i}", prompt=p, max_tokens=12 + 5 * i)
            for i, p in enumerate(PROMPTS)
        ]
        # Staggered arrivals: requests join a batch that is already decoding, and wait for a
        # slot once four are running.
        results = await asyncio.gather(
            *(_collect(engine, r, delay_s=0.004 * i) for i, r in enumerate(requests))
        )
        assert 0.0 < engine.load().decode_busy_share <= 1.0  # the loop just worked
    finally:
        await engine.shutdown()
    loaded = load_causal_lm(llama_dir)
    for request, tokens in zip(requests, results, strict=True):
        assert tokens == hf_generate(loaded, request.prompt, request.max_tokens), request.prompt
    assert engine._scheduler is not None
    assert engine._scheduler.batched_tokens > engine._scheduler.steps  # steps were shared


async def test_pool_keeps_only_key_value_heads(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = build_tiny_llama(tmp_path / "llama", tiny_model_dir)
    engine = await _engine(folder, max_running=3, kv_max_len=128)
    try:
        load = engine.load()
        # 2 layers x (keys + values) x 3 slots x 2 kv heads x 128 positions x 16 wide x 4 bytes
        assert load.kv_pool_bytes == 2 * 2 * 3 * 2 * 128 * 16 * 4
        assert load.kv_pool_capacity_tokens == 3 * 128
        phases = ["weights", "weight_layout", "kv_pool", "warm_up"]
        assert list(engine.startup_s) == phases  # the start-up phases
    finally:
        await engine.shutdown()


async def test_pool_is_sized_by_what_the_tier_admits(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = build_tiny_llama(tmp_path / "llama", tiny_model_dir, max_position_embeddings=8192)
    engine = await _engine(folder, max_running=2, max_prompt_tokens=100, max_tokens=20)
    try:
        assert engine.load().kv_pool_capacity_tokens == 2 * 120  # not 2 x 8192
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope"),
        ({"model_type": "mistral", "sliding_window": 16}, "sliding window of 16"),
    ],
)
async def test_what_the_pool_cannot_reproduce_decodes_per_request(
    options: dict[str, Any],
    reason: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder = build_tiny_llama(tmp_path / "model", tiny_model_dir, **options)
    loaded = load_causal_lm(folder)
    why = pooled_passes(loaded.model, 64)
    assert isinstance(why, str) and reason in why
    with caplog.at_level(logging.INFO, logger="services.tier.torch_engine"):
        engine = await _engine(folder, max_running=2, kv_max_len=64)
    try:
        assert not engine.batching and list(engine.startup_s) == ["weights"]
        assert reason in caplog.text and "one decode thread per request" in caplog.text
        request = GenerationRequest(request_id="a", prompt=PROMPTS[0], max_tokens=8)
        assert await _collect(engine, request) == hf_generate(loaded, request.prompt, 8)
    finally:
        await engine.shutdown()
