"""The TensorRT-LLM engine for NVIDIA GPUs: `tensorrt_llm.LLM.generate_async(streaming=True)`,
streamed from each output's `token_ids_diff` / `text_diff`, aborted when the caller leaves.

TensorRT-LLM schedules in-flight batching and owns the KV cache (`KvCacheConfig`); this module
only translates. Prompt limits, admission, usage, the finish rule and health are the shared
engine lifecycle's (engine_lifecycle.py). It imports `tensorrt_llm` lazily, on start(), so CPU
installs never need it. Knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from services.common.config import TierConfig
from services.common.errors import ConfigError
from services.tier.engine import GenerationChunk
from services.tier.engine_lifecycle import EngineLifecycle, ModelFootprint
from services.tier.prepared_request import PreparedRequest, PromptFormat
from services.tier.tokenizer_loading import IncrementalDetokenizer, eos_token_ids, load_tokenizer


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


class TensorRtLlmEngine(EngineLifecycle):
    name = "tensorrt_llm"
    per_token_detail = False  # its logprobs come without each token's own text

    def __init__(self, config: TierConfig, api: TensorRtLlmApi | None = None) -> None:
        super().__init__(config)
        self._api = api
        self._llm: Any = None
        self._tokenizer: Any = None
        self._outputs: dict[str, Any] = {}

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

    async def _start_model(self) -> PromptFormat:
        api = self._api or import_tensorrt_llm()
        self._api = api
        path = self._config.model_path
        self._tokenizer = load_tokenizer(path)
        self._llm = await asyncio.to_thread(api.LLM, **self.llm_arguments(api))
        # TensorRT-LLM checks prompt + max_tokens against the engine's own context
        return PromptFormat(self._tokenizer, eos_token_ids(path, self._tokenizer), None)

    def _sampling(self, prepared: PreparedRequest) -> Any:
        assert self._api is not None
        s = prepared.sampling
        return self._api.SamplingParams(
            max_tokens=prepared.max_tokens,
            temperature=s.temperature if not s.greedy else 0.0,
            top_p=s.top_p,
            top_k=s.top_k or None,
            seed=s.seed,
            logprobs=1,
        )

    async def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Streams generate_async's increments; if the caller leaves before the end, aborts
        the request on the engine."""
        output = self._llm.generate_async(
            list(prepared.prompt_ids), sampling_params=self._sampling(prepared), streaming=True
        )
        self._outputs[prepared.request_id] = output
        finished = False
        # TensorRT-LLM's text starts at the first new token; a continued answer's text must
        # follow the tokens streamed before (a leading space, a split character): ours does
        detok = None
        if prepared.continued:
            detok = IncrementalDetokenizer(
                self._tokenizer, prepared.continued, prepared.continued_chars
            )
        try:
            async for step in output:
                completion = step.outputs[0]
                token_ids = list(completion.token_ids_diff)
                logprobs = completion.logprobs[len(completion.token_ids) - len(token_ids) :]
                finished = bool(step.finished)
                finish = None
                if finished:
                    last = completion.token_ids[-1] if completion.token_ids else None
                    finish = prepared.finish_after(last, len(completion.token_ids), ended=True)
                text = completion.text_diff
                if detok is not None:
                    text = detok.add(token_ids, final=finish is not None)
                yield GenerationChunk(
                    tuple(token_ids),
                    text,
                    tuple(_logprob(e) for e in logprobs),
                    finish,
                )
        finally:
            self._outputs.pop(prepared.request_id, None)
            if not finished:
                output.abort()

    async def abort(self, request_id: str) -> None:
        output = self._outputs.get(request_id)
        if output is not None:
            output.abort()

    def _footprint(self) -> ModelFootprint:
        cfg = self._config
        return ModelFootprint(
            model=cfg.model_path.name,
            kv_pool_capacity_tokens=cfg.kv_max_len * cfg.max_running,
        )

    async def _stop_model(self) -> None:
        for output in list(self._outputs.values()):
            output.abort()
        if self._llm is not None and hasattr(self._llm, "shutdown"):
            await asyncio.to_thread(self._llm.shutdown)
