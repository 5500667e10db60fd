"""Contract of the TensorRT-LLM engine against a FAKE LLM API (tests/fakes): what it builds the
LLM with, how it turns streamed increments into chunks, and that it aborts on early close.
This is not coverage of TensorRT-LLM itself, which needs an NVIDIA GPU."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import pytest

from services.common.config import TierConfig
from services.common.errors import ConfigError, InvalidArgument
from services.tier.engine import GenerationRequest, Sampling
from services.tier.factory import create_engine
from services.tier.tensorrt_llm_engine import TensorRtLlmApi, TensorRtLlmEngine
from services.tier.tokenizer_loading import encode_prompt
from tests.fakes.fake_tensorrt_llm import FakeKvCacheConfig, FakeLLM, FakeSamplingParams

FAKE_API = TensorRtLlmApi(FakeLLM, FakeSamplingParams, FakeKvCacheConfig)


def _config(model_dir: Path, **options: object) -> TierConfig:
    return TierConfig(
        name="large",
        model_path=model_dir,
        engine="tensorrt_llm",
        device="cuda",
        **options,  # type: ignore[arg-type]
    )


async def test_llm_is_built_from_the_tier_config(tiny_model_dir: Path) -> None:
    engine = TensorRtLlmEngine(
        _config(tiny_model_dir, max_running=8, max_num_tokens=4096), FAKE_API
    )
    await engine.start()
    llm = FakeLLM.instances[-1]
    assert llm.model == str(tiny_model_dir)
    assert llm.kwargs["max_batch_size"] == 8 and llm.kwargs["max_num_tokens"] == 4096
    assert llm.kwargs["kv_cache_config"].free_gpu_memory_fraction == 0.85
    pooled = TensorRtLlmEngine(_config(tiny_model_dir, max_running=4, kv_max_len=256), FAKE_API)
    assert pooled.llm_arguments(FAKE_API)["kv_cache_config"].max_tokens == 1024
    await engine.shutdown()
    assert llm.shut_down


async def test_streams_increments_as_chunks(tiny_model_dir: Path) -> None:
    engine = TensorRtLlmEngine(_config(tiny_model_dir), FAKE_API)
    await engine.start()
    request = GenerationRequest(request_id="r1", prompt="What is your return policy?", max_tokens=5)
    chunks = [chunk async for chunk in engine.generate(request)]
    prompt_ids = encode_prompt(engine._tokenizer, request.prompt)
    expected = list(reversed(prompt_ids))[:5]
    assert [t for c in chunks for t in c.token_ids] == expected
    assert "".join(c.text for c in chunks) == "".join(f"<{t}>" for t in expected)
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert engine.load().completed == 1


async def test_leaving_early_aborts_the_request(tiny_model_dir: Path) -> None:
    engine = TensorRtLlmEngine(_config(tiny_model_dir), FAKE_API)
    await engine.start()
    stream = engine.generate(GenerationRequest(request_id="r2", prompt="Hello there", max_tokens=9))
    async with contextlib.aclosing(stream):
        async for _ in stream:
            break
    output = FakeLLM.instances[-1].requests[-1]
    assert output.aborted and not output.finished
    assert engine.load().running == 0


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is installed here"
)
async def test_choosing_it_without_the_package_is_a_clear_start_error(tiny_model_dir: Path) -> None:
    engine = create_engine(_config(tiny_model_dir))
    with pytest.raises(ConfigError, match="needs the tensorrt_llm package"):
        await engine.start()


async def test_per_token_detail_is_refused_with_a_reason(tiny_model_dir: Path) -> None:
    engine = TensorRtLlmEngine(_config(tiny_model_dir), FAKE_API)
    await engine.start()
    request = GenerationRequest(
        request_id="lp", prompt="Hi", max_tokens=4, sampling=Sampling(top_logprobs=2)
    )
    with pytest.raises(InvalidArgument, match=r"sampling\.top_logprobs: per-token detail"):
        async for _ in engine.generate(request):
            pass
    assert engine.load().running == 0  # its admission slot is free again
    await engine.shutdown()
