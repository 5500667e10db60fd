"""The vllm engine: vLLM's async engine (v1 AsyncLLM) in the tier's own process (`engine =
"vllm"`), so a tier serves on vLLM's kernels, paged KV cache, continuous batching and tensor or
pipeline parallelism while keeping every tier contract.

The tier renders and tokenises the prompt itself (prepare_request: prompt limits, PromptTooLong,
fit_to_context, continuation tokens checked) and sends vLLM the token ids: a continuation's
tokens are prefilled after the prompt, so a replica goes on in the same revision. vLLM returns
token ids and log-probabilities; the tier's ChunkAssembler turns them into chunks, so text,
per-token detail and stop sequences are the torch engine's. Admission (engine_lifecycle.py)
runs at most max_num_seqs requests in vLLM and queues max_queued more. vLLM starts its engine
core in a spawned process: the tier must be started from a spawn-safe entry
(services.tier.vllm_server). Knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from services.common import parent_watch
from services.common.config import TierConfig
from services.common.errors import Unavailable
from services.tier.chunking import ChunkAssembler
from services.tier.engine import EnginePhases, GenerationChunk
from services.tier.engine_lifecycle import EngineLifecycle, ModelFootprint
from services.tier.model_fingerprint import folder_fingerprint
from services.tier.prepared_request import PreparedRequest, PromptFormat, held_back_entries
from services.tier.tokenizer_loading import eos_token_ids, load_tokenizer
from services.tier.vllm_args import (
    engine_args,
    engine_environment,
    max_num_seqs,
    sampling_args,
    top_alternatives,
    vllm_priority,
)

log = logging.getLogger(__name__)


@dataclass
class VllmStats:
    """What vLLM's scheduler reported last (its stat logger writes here after each step)."""

    running: int = 0
    waiting: int = 0  # held but not scheduled: waiting for KV-cache blocks, or preempted
    kv_usage: float = 0.0  # share of the KV-cache blocks in use, in [0, 1]
    kv_peak: float = 0.0
    # share of the prompt tokens found in the prefix cache over the last PREFIX_WINDOW requests
    prefix_cache_hit_rate: float = 0.0


PREFIX_WINDOW = 1000  # requests the prefix-cache hit rate is taken over (vLLM's own default)


def scheduler_counts(stats: VllmStats, in_flight: int) -> tuple[int, int]:
    """vLLM's running and waiting requests, bounded by the `in_flight` requests the tier has
    in vLLM: vLLM reports its counts only after a step it takes, so after the last request
    was aborted (no step follows) its report still counts it."""
    running = min(stats.running, in_flight)
    return running, min(stats.waiting, in_flight - running)


def engine_phases(stats: Any, cached_prompt_tokens: int | None) -> EnginePhases | None:
    """One request's phases inside vLLM from its RequestOutput's `metrics` (RequestStateStats:
    the engine core's timestamps, seconds) and `num_cached_tokens`; None until vLLM has
    scheduled it and streamed its first token (or without stats)."""
    queued = getattr(stats, "queued_ts", 0.0)
    scheduled = getattr(stats, "scheduled_ts", 0.0)
    first = getattr(stats, "first_token_ts", 0.0)
    last = getattr(stats, "last_token_ts", 0.0)
    if not (0.0 < queued <= scheduled <= first <= last):
        return None
    return EnginePhases(
        scheduler_wait_ms=(scheduled - queued) * 1000,
        prefill_ms=(first - scheduled) * 1000,
        decode_ms=(last - first) * 1000,
        preemptions=int(getattr(stats, "num_preemptions", 0)),
        cached_prompt_tokens=int(cached_prompt_tokens or 0),
    )


def stat_logger(stats: VllmStats) -> Callable[[Any, int], Any]:
    """A vLLM stat-logger factory whose loggers keep the scheduler's counts in `stats`, and
    the prefix cache's hit rate over recent requests (vLLM's CachingMetrics window)."""
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.stats import CachingMetrics

    class Recorder(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._prefix = CachingMetrics(max_recent_requests=PREFIX_WINDOW)

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                stats.running = int(scheduler_stats.num_running_reqs)
                stats.waiting = int(scheduler_stats.num_waiting_reqs)
                stats.kv_usage = float(scheduler_stats.kv_cache_usage)
                stats.kv_peak = max(stats.kv_peak, stats.kv_usage)
                self._prefix.observe(scheduler_stats.prefix_cache_stats)
                stats.prefix_cache_hit_rate = float(self._prefix.hit_rate)

        def log_engine_initialized(self) -> None:
            pass

    return Recorder


def model_size(path: Path) -> tuple[int, int]:
    """The folder's parameters (from tiermesh.json, 0 if not known) and weight bytes."""
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    try:
        params = int(json.loads((path / "tiermesh.json").read_text()).get("params", 0))
    except (OSError, ValueError):
        params = 0
    return params, weights


class VllmEngine(EngineLifecycle):
    name = "vllm"

    def __init__(self, config: TierConfig) -> None:
        super().__init__(replace(config, max_running=max_num_seqs(config)))
        self._llm: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._tokenizer: Any = None
        self._running: set[str] = set()
        self._stats = VllmStats()
        self._kv_capacity_tokens = 0
        self._size = (0, 0)  # parameters, weight bytes
        self.startup_s: dict[str, float] = {}

    def _fingerprint_model(self) -> str:
        return folder_fingerprint(self._config.model_path)

    async def _start_model(self) -> PromptFormat:
        cfg = self._config
        os.environ.update(engine_environment(cfg, os.environ))
        # vLLM's engine core, spawned below, stops when this process dies, even by SIGKILL
        # (services/tier/vllm_server.py arms it); else it lives on holding the model's memory
        os.environ[parent_watch.ENV] = str(os.getpid())
        started = time.perf_counter()
        from vllm.engine.arg_utils import AsyncEngineArgs  # vLLM: only a vllm tier
        from vllm.v1.engine.async_llm import AsyncLLM

        self.startup_s["model_code"] = time.perf_counter() - started
        started = time.perf_counter()
        self._tokenizer = await asyncio.to_thread(load_tokenizer, cfg.model_path)
        eos = eos_token_ids(cfg.model_path, self._tokenizer)
        self._llm = AsyncLLM.from_engine_args(
            AsyncEngineArgs(**engine_args(cfg)), stat_loggers=[stat_logger(self._stats)]
        )
        self.startup_s["engine"] = time.perf_counter() - started
        cache = self._llm.vllm_config.cache_config
        self._kv_capacity_tokens = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        self._size = await asyncio.to_thread(model_size, cfg.model_path)
        context = int(self._llm.model_config.max_model_len)
        vocab = int(self._llm.model_config.get_vocab_size())
        log.info(
            "tier %s: vLLM serving %s (context %d, max_num_seqs %d)",
            cfg.name,
            cfg.model_path,
            context,
            self._config.max_running,
        )
        return PromptFormat(self._tokenizer, eos, context, vocab)

    async def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        """vLLM's deltas for the prompt's token ids, as the tier's chunks. Closed early (the
        caller left, a stop sequence, a deadline), the request is aborted in vLLM."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self._llm is None:
            raise Unavailable(f"tier {self._config.name}: vLLM is not started")
        sampling = prepared.sampling
        detailed = sampling.top_logprobs is not None
        params = SamplingParams(
            **sampling_args(sampling, prepared.max_tokens, prepared.eos_token_ids),
            output_kind=RequestOutputKind.DELTA,
        )
        assembler = ChunkAssembler(
            self._tokenizer,
            prepared.tokens_per_chunk,
            prepared.continued,
            prepared.continued_chars,
            detailed=detailed,
            held=held_back_entries(prepared, self._tokenizer),
        )
        rid = prepared.request_id
        prompt = TokensPrompt(prompt_token_ids=list(prepared.prompt_ids))
        generated, finished = 0, False
        self._running.add(rid)
        outputs = self._llm.generate(prompt, params, rid, priority=vllm_priority(prepared.priority))
        try:
            async for output in outputs:
                completion = output.outputs[0]
                steps = completion.logprobs or []
                count = len(completion.token_ids)
                for index, token in enumerate(completion.token_ids):
                    generated += 1
                    last = output.finished and index == count - 1
                    finish = prepared.finish_after(token, generated, ended=last)
                    step = steps[index] if index < len(steps) else {}
                    ranked = {t: (lp.logprob, lp.rank) for t, lp in step.items()}
                    logprob = ranked.get(token, (0.0, None))[0]
                    top = top_alternatives(ranked, sampling.top_logprobs or 0) if detailed else ()
                    chunk = assembler.add(token, logprob, finish, top)
                    finished = finish is not None  # vLLM is done with it: nothing to abort
                    if finished and chunk is not None:
                        phases = engine_phases(output.metrics, output.num_cached_tokens)
                        chunk = replace(chunk, engine_phases=phases)
                    if chunk is not None:
                        yield chunk
                    if finished:
                        return
            if not finished and not self._closing:
                raise Unavailable(f"tier {self._config.name}: vLLM ended the answer unfinished")
        finally:
            self._running.discard(rid)
            await outputs.aclose()  # closed early, vLLM's stream aborts the request itself
            if not finished and self._llm is not None:
                with contextlib.suppress(Exception):
                    await self._llm.abort(rid)

    async def abort(self, request_id: str) -> None:
        if self._llm is not None and request_id in self._running:
            await self._llm.abort(request_id)

    def _footprint(self) -> ModelFootprint:
        """The model's size, vLLM's KV cache (its capacity in tokens, the share in use at vLLM's
        last scheduler step and the most since start), its scheduler's running and waiting
        requests at that step and its prefix cache's recent hit rate."""
        capacity, stats = self._kv_capacity_tokens, self._stats
        running, waiting = scheduler_counts(stats, len(self._running))
        return ModelFootprint(
            model=self._config.model_path.name or "vllm",
            params=self._size[0],
            weights_bytes=self._size[1],
            kv_pool_capacity_tokens=capacity,
            kv_pool_used_tokens=round(stats.kv_usage * capacity),
            kv_pool_peak_tokens=round(stats.kv_peak * capacity),
            engine_running=running,
            engine_waiting=waiting,
            prefix_cache_hit_rate=stats.prefix_cache_hit_rate,
        )

    async def _stop_model(self) -> None:
        if self._llm is None:
            return
        for request_id in list(self._running):
            with contextlib.suppress(Exception):
                await self._llm.abort(request_id)
        self._llm.shutdown()
        self._llm = None
