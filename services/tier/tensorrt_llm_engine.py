"""The TensorRT-LLM engine for NVIDIA GPUs: `tensorrt_llm.LLM.generate_async(streaming=True)`,
streamed from each output's `token_ids_diff` / `text_diff`, aborted when the caller leaves.

TensorRT-LLM schedules in-flight batching and owns the KV cache (`KvCacheConfig`); this module
only translates. It imports `tensorrt_llm` lazily, on start(), so CPU installs never need it.
Knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from services.common.config import TierConfig
from services.common.errors import ConfigError, InvalidArgument, Unavailable
from services.tier.admission import Admission
from services.tier.engine import EngineLoad, GenerationChunk, GenerationRequest, GenerationUsage
from services.tier.tokenizer_loading import encode_prompt, load_tokenizer, render_prompt


@dataclass(frozen=True)
class TensorRtLlmApi:
    """The three names this engine uses from the package (a fake stands in for tests)."""

    LLM: Any
    SamplingParams: Any
    KvCacheConfig: Any


def import_tensorrt_llm() -> TensorRtLlmApi:
    try:
        import tensorrt_llm
        from tensorrt_llm.llmapi import KvCacheConfig
    except ImportError as e:
        raise ConfigError(
            "engine: 'tensorrt_llm' needs the tensorrt_llm package, which is not installed "
            f'({e}); install TensorRT-LLM on an NVIDIA GPU machine, or set engine = "torch"'
        ) from None
    return TensorRtLlmApi(tensorrt_llm.LLM, tensorrt_llm.SamplingParams, KvCacheConfig)


def _logprob(entry: Any) -> float:
    """A token's log-prob from TensorRT-LLM's logprobs: a float, or {token_id: Logprob}."""
    if isinstance(entry, dict):
        entry = next(iter(entry.values()))
    return float(getattr(entry, "logprob", entry))


class TensorRtLlmEngine:
    name = "tensorrt_llm"

    def __init__(self, config: TierConfig, api: TensorRtLlmApi | None = None) -> None:
        self._config = config
        self._api = api
        self._llm: Any = None
        self._tokenizer: Any = None
        self._admission = Admission(config.max_running, config.max_queued)
        self._outputs: dict[str, Any] = {}
        self._ttfts: deque[float] = deque(maxlen=256)
        self._completed = 0
        self._closing = False

    def llm_arguments(self, api: TensorRtLlmApi) -> dict[str, Any]:
        """What LLM(...) is built with, from the tier config."""
        cfg = self._config
        if cfg.kv_max_len:
            kv_cache = api.KvCacheConfig(max_tokens=cfg.kv_max_len * cfg.max_running)
        else:
            kv_cache = api.KvCacheConfig(free_gpu_memory_fraction=cfg.kv_free_gpu_memory_fraction)
        arguments: dict[str, Any] = {
            "model": str(cfg.model_path),
            "kv_cache_config": kv_cache,
            "max_batch_size": cfg.max_running,
        }
        if cfg.max_num_tokens:
            arguments["max_num_tokens"] = cfg.max_num_tokens
        return arguments

    async def start(self) -> None:
        api = self._api or import_tensorrt_llm()
        self._api = api
        self._tokenizer = load_tokenizer(self._config.model_path)
        self._llm = await asyncio.to_thread(api.LLM, **self.llm_arguments(api))

    def check_health(self) -> None:
        if self._llm is None:
            raise Unavailable(f"tier {self._config.name}: model not loaded")
        if self._closing:
            raise Unavailable(f"tier {self._config.name}: shutting down")

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        text = (
            render_prompt(self._tokenizer, list(request.messages))
            if request.messages
            else request.prompt
        )
        ids = encode_prompt(self._tokenizer, text)
        if not ids:
            raise InvalidArgument("prompt: renders to zero tokens")
        if len(ids) > self._config.max_prompt_tokens:
            raise InvalidArgument(
                f"prompt: {len(ids)} tokens exceeds this tier's limit of "
                f"{self._config.max_prompt_tokens} tokens"
            )
        return ids

    def _sampling(self, request: GenerationRequest) -> Any:
        assert self._api is not None
        s = request.sampling
        return self._api.SamplingParams(
            max_tokens=request.max_tokens,
            temperature=s.temperature if not s.greedy else 0.0,
            top_p=s.top_p,
            top_k=s.top_k or None,
            seed=s.seed,
            logprobs=1,
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Steps: validate, take a running slot (bounded queue), stream generate_async's
        increments; if the caller leaves before the end, abort the request on the engine."""
        received = time.perf_counter()
        self.check_health()
        prompt_ids = self._prompt_ids(request)
        async with self._admission.slot():
            queue_ms = (time.perf_counter() - received) * 1000
            output = self._llm.generate_async(
                prompt_ids, sampling_params=self._sampling(request), streaming=True
            )
            self._outputs[request.request_id] = output
            first_ms: float | None = None
            finished = False
            try:
                async for step in output:
                    completion = step.outputs[0]
                    token_ids = list(completion.token_ids_diff)
                    logprobs = completion.logprobs[len(completion.token_ids) - len(token_ids) :]
                    if first_ms is None and token_ids:
                        first_ms = (time.perf_counter() - received) * 1000
                        self._ttfts.append(first_ms)
                    finished = bool(step.finished)
                    usage = None
                    finish = None
                    if finished:
                        finish = "length" if completion.finish_reason == "length" else "stop"
                        self._completed += 1
                        usage = GenerationUsage(
                            prompt_tokens=len(prompt_ids),
                            completion_tokens=len(completion.token_ids),
                            queue_ms=queue_ms,
                            ttft_ms=first_ms or 0.0,
                            total_ms=(time.perf_counter() - received) * 1000,
                        )
                    yield GenerationChunk(
                        tuple(token_ids),
                        completion.text_diff,
                        tuple(_logprob(e) for e in logprobs),
                        finish,
                        usage,
                    )
            finally:
                self._outputs.pop(request.request_id, None)
                if not finished:
                    output.abort()

    async def abort(self, request_id: str) -> None:
        output = self._outputs.get(request_id)
        if output is not None:
            output.abort()

    def load(self) -> EngineLoad:
        ttfts = sorted(self._ttfts)
        cfg = self._config
        return EngineLoad(
            model=cfg.model_path.name,
            device=cfg.device,
            serving=self._llm is not None and not self._closing,
            running=self._admission.running,
            max_running=cfg.max_running,
            queued=self._admission.queued,
            max_queued=cfg.max_queued,
            ttft_ms_p50=statistics.median(ttfts) if ttfts else 0.0,
            ttft_ms_p99=ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else 0.0,
            kv_pool_capacity_tokens=cfg.kv_max_len * cfg.max_running,
            kv_pool_used_tokens=0,
            kv_pool_peak_tokens=0,
            weights_bytes=0,
            kv_pool_bytes=0,
            completed=self._completed,
            rejected=self._admission.rejected,
            params=0,
            max_prompt_tokens=cfg.max_prompt_tokens,
            max_tokens=cfg.max_tokens,
        )

    async def shutdown(self) -> None:
        self._closing = True
        for output in list(self._outputs.values()):
            output.abort()
        if self._llm is not None and hasattr(self._llm, "shutdown"):
            await asyncio.to_thread(self._llm.shutdown)
