"""The torch engine: a local Hugging Face causal LM on CPU or CUDA, streamed token by token.

GPT-2 models run with continuous batching over a KV-cache pool allocated at start
(batch_scheduler.py); other architectures, or `batching = false`, decode each request on its
own worker thread with its own cache (decode.py). Admission bounds how many run (= pool slots)
and how many wait. Knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch

from services.common.config import TierConfig
from services.common.errors import InvalidArgument, Unavailable
from services.tier import gpt2_pooled
from services.tier.admission import Admission
from services.tier.batch_scheduler import BatchScheduler, Sequence
from services.tier.chunking import END, ChunkAssembler, Emit
from services.tier.decode import decode_tokens
from services.tier.engine import EngineLoad, GenerationChunk, GenerationRequest, GenerationUsage
from services.tier.kv_pool import KvCachePool
from services.tier.model_loading import LoadedModel, load_causal_lm
from services.tier.tokenizer_loading import encode_prompt, render_prompt


class TorchEngine:
    name = "torch"

    def __init__(self, config: TierConfig) -> None:
        self._config = config
        self._loaded: LoadedModel | None = None
        self._admission = Admission(config.max_running, config.max_queued)
        self._pool: KvCachePool | None = None
        self._scheduler: BatchScheduler | None = None
        self._torch_thread: ThreadPoolExecutor | None = None  # loads the model, runs the batch
        self._executor: ThreadPoolExecutor | None = None
        self._stops: dict[str, threading.Event] = {}
        self._kv_used: dict[str, int] = {}  # sequential path: positions per request
        self._kv_peak = 0
        self._ttfts: deque[float] = deque(maxlen=256)
        self._completed = 0
        self._closing = False

    @property
    def batching(self) -> bool:
        return self._scheduler is not None

    async def start(self) -> None:
        torch.set_num_threads(self._config.torch_threads)
        cfg = self._config
        self._torch_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"torch-{cfg.name}"
        )
        loaded = await asyncio.get_running_loop().run_in_executor(
            self._torch_thread, load_causal_lm, cfg.model_path, cfg.device, cfg.dtype
        )
        if cfg.batching and gpt2_pooled.supports(loaded.model):
            max_len = min(cfg.kv_max_len or loaded.context_length, loaded.context_length)
            loaded = replace(loaded, context_length=max_len)
            self._pool = await asyncio.get_running_loop().run_in_executor(
                self._torch_thread, gpt2_pooled.create_pool, loaded.model, cfg.max_running, max_len
            )
            self._scheduler = BatchScheduler(loaded, self._pool, cfg.prefill_tokens_per_step)
            self._scheduler.start(self._torch_thread)
        else:
            self._executor = ThreadPoolExecutor(
                max_workers=cfg.max_running, thread_name_prefix=f"decode-{cfg.name}"
            )
        self._loaded = loaded

    def check_health(self) -> None:
        if self._loaded is None:
            raise Unavailable(f"tier {self._config.name}: model not loaded")
        if self._closing:
            raise Unavailable(f"tier {self._config.name}: shutting down")

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        assert self._loaded is not None
        tokenizer = self._loaded.tokenizer
        text = (
            render_prompt(tokenizer, list(request.messages)) if request.messages else request.prompt
        )
        ids = encode_prompt(tokenizer, text)
        limit = min(self._config.max_prompt_tokens, self._loaded.context_length - 1)
        if not ids:
            raise InvalidArgument("prompt: renders to zero tokens")
        if len(ids) > limit:
            raise InvalidArgument(
                f"prompt: {len(ids)} tokens exceeds this tier's limit of {limit} tokens"
            )
        if len(ids) + request.max_tokens > self._loaded.context_length:
            raise InvalidArgument(
                f"max_tokens: prompt of {len(ids)} tokens + max_tokens {request.max_tokens} "
                f"exceeds the model's context of {self._loaded.context_length} tokens"
            )
        return ids

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Steps: validate the prompt length, wait for a running slot (bounded queue), hand the
        request to the batch scheduler (or a worker thread), relay its chunks; on early close,
        stop its decoding within one step and free its slot."""
        received = time.perf_counter()
        self.check_health()
        assert self._loaded is not None
        prompt_ids = self._prompt_ids(request)
        async with self._admission.slot():
            self.check_health()
            queue_ms = (time.perf_counter() - received) * 1000
            loop = asyncio.get_running_loop()
            chunks: asyncio.Queue[Any] = asyncio.Queue()  # at most max_tokens + 2 items
            stop = threading.Event()
            self._stops[request.request_id] = stop

            def emit(item: Any) -> None:
                loop.call_soon_threadsafe(chunks.put_nowait, item)

            per_chunk = request.tokens_per_chunk or self._config.tokens_per_chunk
            assembler = ChunkAssembler(self._loaded.tokenizer, per_chunk)
            if self._scheduler is not None:
                self._scheduler.submit(Sequence(request, prompt_ids, stop, emit, assembler))
            else:
                assert self._executor is not None
                loop.run_in_executor(
                    self._executor, self._decode_alone, request, prompt_ids, stop, emit, assembler
                )
            first_token_ms: float | None = None
            completion_tokens = 0
            try:
                while True:
                    item = await chunks.get()
                    if item is END:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    token_ids, text, logprobs, finish = item
                    completion_tokens += len(token_ids)
                    self._kv_note(request.request_id, len(prompt_ids) + completion_tokens)
                    if first_token_ms is None:
                        first_token_ms = (time.perf_counter() - received) * 1000
                        self._ttfts.append(first_token_ms)
                    usage = None
                    if finish is not None:
                        self._completed += 1
                        usage = GenerationUsage(
                            prompt_tokens=len(prompt_ids),
                            completion_tokens=completion_tokens,
                            queue_ms=queue_ms,
                            ttft_ms=first_token_ms,
                            total_ms=(time.perf_counter() - received) * 1000,
                        )
                    yield GenerationChunk(tuple(token_ids), text, tuple(logprobs), finish, usage)
            finally:
                stop.set()
                self._stops.pop(request.request_id, None)
                self._kv_used.pop(request.request_id, None)

    def _decode_alone(
        self,
        request: GenerationRequest,
        prompt_ids: list[int],
        stop: threading.Event,
        emit: Emit,
        chunks: ChunkAssembler,
    ) -> None:
        """Runs on a worker thread: decodes one request with its own KV cache."""
        try:
            assert self._loaded is not None
            eos = self._loaded.eos_token_ids
            steps = decode_tokens(
                self._loaded.model,
                prompt_ids,
                max_new_tokens=request.max_tokens,
                sampling=request.sampling,
                eos_token_ids=eos,
                should_stop=stop.is_set,
            )
            for count, (token, logprob) in enumerate(steps, start=1):
                finish = "stop" if token in eos else None
                if finish is None and count >= request.max_tokens:
                    finish = "length"
                chunk = chunks.add(token, logprob, finish)
                if chunk is not None:
                    emit(chunk)
            emit(END)
        except BaseException as e:  # relayed to the consumer, which raises it
            emit(e)

    def _kv_note(self, request_id: str, positions: int) -> None:
        if self._pool is None:
            self._kv_used[request_id] = positions
            self._kv_peak = max(self._kv_peak, sum(self._kv_used.values()))

    async def abort(self, request_id: str) -> None:
        stop = self._stops.get(request_id)
        if stop is not None:
            stop.set()

    def load(self) -> EngineLoad:
        loaded, pool = self._loaded, self._pool
        ttfts = sorted(self._ttfts)
        context = loaded.context_length if loaded else 0
        if pool is not None:
            capacity, used, peak, pool_bytes = (
                pool.capacity_tokens,
                pool.used_tokens,
                pool.peak_tokens,
                pool.bytes,
            )
        else:  # no pool: report the bound the per-request caches can reach
            capacity = self._config.max_running * context
            used, peak = sum(self._kv_used.values()), self._kv_peak
            pool_bytes = capacity * _kv_bytes_per_token(loaded) if loaded else 0
        return EngineLoad(
            model=loaded.name if loaded else self._config.model_path.name,
            device=self._config.device,
            serving=loaded is not None and not self._closing,
            running=self._admission.running,
            max_running=self._config.max_running,
            queued=self._admission.queued,
            max_queued=self._config.max_queued,
            ttft_ms_p50=statistics.median(ttfts) if ttfts else 0.0,
            ttft_ms_p99=ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] if ttfts else 0.0,
            kv_pool_capacity_tokens=capacity,
            kv_pool_used_tokens=used,
            kv_pool_peak_tokens=peak,
            weights_bytes=loaded.weights_bytes if loaded else 0,
            kv_pool_bytes=pool_bytes,
            completed=self._completed,
            rejected=self._admission.rejected,
            params=loaded.params if loaded else 0,
            max_prompt_tokens=self._config.max_prompt_tokens,
            max_tokens=self._config.max_tokens,
        )

    async def shutdown(self) -> None:
        self._closing = True
        for stop in self._stops.values():
            stop.set()
        if self._scheduler is not None:
            await asyncio.to_thread(self._scheduler.shutdown)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        if self._torch_thread is not None:
            await asyncio.to_thread(self._torch_thread.shutdown, wait=True)


def _kv_bytes_per_token(loaded: LoadedModel) -> int:
    """Bytes of keys and values one token position takes across all layers."""
    config = loaded.model.config
    layers = int(getattr(config, "n_layer", getattr(config, "num_hidden_layers", 0)))
    width = int(getattr(config, "n_embd", getattr(config, "hidden_size", 0)))
    element = int(next(loaded.model.parameters()).element_size())
    return 2 * layers * width * element
