"""Batched prefill on real tiny checkpoints (GPT-2, and Llama-family models with grouped-query
attention): prompts prefilled together in one packed forward, attending one prompt a call or,
of similar lengths, padded into one call, give the same logits and the same greedy tokens as
each prompt prefilled alone, and a burst of requests to the engine is
prefilled in shared passes with every answer equal to decoding it alone."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

from services.common.config import TierConfig
from services.tier.decode import decode_steps
from services.tier.engine import GenerationRequest, Sampling
from services.tier.kv_pool import KvCachePool
from services.tier.model_loading import load_causal_lm
from services.tier.pooled_models import PooledPasses, pooled_passes
from services.tier.prefill_attention import padded_prompts
from services.tier.step_planner import StepPlan
from services.tier.tokenizer_loading import encode_prompt
from services.tier.torch_engine import TorchEngine
from tests.engine_prompts import PROMPTS
from tests.tiny_llama import build_tiny_llama


@pytest.fixture(scope="module", params=["gpt2", "llama", "qwen2"])
def model_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Path:
    if request.param == "gpt2":
        return tiny_model_dir
    folder = tmp_path_factory.mktemp(request.param)
    options = (
        {"model_type": "qwen2", "tie_word_embeddings": False} if request.param == "qwen2" else {}
    )
    return build_tiny_llama(folder, tiny_model_dir, seed=5, **options)  # type: ignore[arg-type]


def _greedy(
    model: object, passes: PooledPasses, pool: KvCachePool, logits: torch.Tensor, steps: int
) -> list[list[int]]:
    """Greedy tokens from prefill logits (B, V), decoding slots 0..B-1 together."""
    slots = list(range(logits.shape[0]))
    tokens = logits.argmax(dim=-1).tolist()
    out = [[t] for t in tokens]
    for _ in range(steps):
        tokens = passes.decode_step(model, pool, slots, tokens).argmax(dim=-1).tolist()
        for row, token in zip(out, tokens, strict=True):
            row.append(token)
    return out


def assert_answers_as_alone(
    model_dir: Path, requests: list[GenerationRequest], results: list[list[int]]
) -> None:
    """Each request's greedy tokens equal decoding its prompt alone, one token at a time."""
    loaded = load_causal_lm(model_dir)
    for request, tokens in zip(requests, results, strict=True):
        alone = decode_steps(
            loaded.model,
            encode_prompt(loaded.tokenizer, request.prompt),
            max_new_tokens=request.max_tokens,
            sampling=Sampling(),
            eos_token_ids=loaded.eos_token_ids,
        )
        assert tokens == [t for t, _, _ in alone], request.prompt


# prompts of similar lengths: attention runs as one call over them padded to the longest
SIMILAR = [
    "What is your return policy?",
    "How much does the blue kettle cost?",
    "The total for 2 mugs",
    "Hello, thank you",
    "Do you ship abroad?",
]


@pytest.mark.parametrize(("prompt_texts", "padded"), [(PROMPTS, False), (SIMILAR, True)])
def test_packed_prefill_equals_one_prompt_at_a_time(
    model_dir: Path, prompt_texts: list[str], padded: bool
) -> None:
    loaded = load_causal_lm(model_dir)
    passes = pooled_passes(loaded.model, 128)
    assert not isinstance(passes, str)
    passes.prepare(loaded.model)
    prompts = [encode_prompt(loaded.tokenizer, p) for p in prompt_texts]
    slots = list(range(len(prompts)))
    together = passes.create_pool(loaded.model, len(prompts), 128)
    batch = together.prefill_batch(slots, prompts)
    # mixed lengths attend one prompt a call; similar ones padded, in one call
    assert (padded_prompts(batch, torch.device("cpu")) is not None) == padded
    batched = passes.prefill(loaded.model, together, batch)
    alone_pool = passes.create_pool(loaded.model, len(prompts), 128)
    alone = torch.cat(
        [
            passes.prefill(loaded.model, alone_pool, alone_pool.prefill_batch([s], [p]))
            for s, p in zip(slots, prompts, strict=True)
        ]
    )  # (B, V)
    assert batched.shape == alone.shape == (len(prompts), batched.shape[1])
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)
    assert together.lengths == alone_pool.lengths == [len(p) for p in prompts]
    # padding reaches the pool as zeros, past each prompt's own length
    torch.testing.assert_close(together.keys, alone_pool.keys, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(together.values, alone_pool.values, rtol=1e-4, atol=1e-4)
    assert _greedy(loaded.model, passes, together, batched, 12) == _greedy(
        loaded.model, passes, alone_pool, alone, 12
    )


async def test_a_burst_is_prefilled_together_and_answers_as_alone(model_dir: Path) -> None:
    config = TierConfig(name="large", model_path=model_dir, max_running=6, max_queued=0)
    engine = TorchEngine(config)
    await engine.start()

    async def collect(request: GenerationRequest) -> list[int]:
        return [t async for chunk in engine.generate(request) for t in chunk.token_ids]

    try:
        requests = [
            GenerationRequest(request_id=f"r{i}", prompt=p, max_tokens=10)
            for i, p in enumerate(PROMPTS)
        ]
        results = await asyncio.gather(*(collect(r) for r in requests))
    finally:
        await engine.shutdown()
    scheduler = engine._scheduler
    assert scheduler is not None
    assert scheduler.prefilled_requests == len(PROMPTS)
    assert scheduler.prefills < len(PROMPTS)  # some prompts shared a prefill pass
    assert_answers_as_alone(model_dir, requests, results)


async def test_a_request_arriving_during_a_prefill_starts_before_the_next_decode_step(
    tiny_model_dir: Path,
) -> None:
    """The second request of a burst reaches the inbox while the first one's prefill runs: it is
    prefilled before any decode step (the first request's second token waits for it), not one
    step later, and both answer as they would alone."""
    config = TierConfig(name="large", model_path=tiny_model_dir, max_running=4, max_queued=0)
    entered = threading.Event()
    prefills: list[tuple[int, int]] = []  # (decode steps so far, requests in the pass)

    class FirstPrefillHeld:
        """The scheduler's step observer: notes each prefill pass before it runs, and holds the
        first until the second request is in the inbox."""

        def before(self, plan: StepPlan) -> None:
            scheduler = engine._scheduler
            if not plan.prefill or scheduler is None:
                return
            prefills.append((scheduler.steps, len(plan.prefill)))
            if len(prefills) == 1:
                entered.set()
                deadline = time.monotonic() + 10
                while scheduler._inbox.empty() and time.monotonic() < deadline:
                    time.sleep(0.001)

    engine = TorchEngine(config, step_observer=FirstPrefillHeld())
    await engine.start()

    async def collect(request: GenerationRequest) -> list[int]:
        return [t async for chunk in engine.generate(request) for t in chunk.token_ids]

    requests = [
        GenerationRequest(request_id=f"r{i}", prompt=p, max_tokens=6)
        for i, p in enumerate(PROMPTS[:2])
    ]
    try:
        first = asyncio.create_task(collect(requests[0]))
        assert await asyncio.to_thread(entered.wait, 10)
        results = [await collect(requests[1]), await first]
    finally:
        await engine.shutdown()
    assert prefills == [(0, 1), (0, 1)]
    assert_answers_as_alone(tiny_model_dir, [requests[1], requests[0]], results)
