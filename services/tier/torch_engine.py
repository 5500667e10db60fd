"""The torch engine: a local Hugging Face causal LM on CPU or CUDA, streamed token by token.

GPT-2 and Llama-family models run with continuous batching over a KV-cache pool allocated at
start (batch_scheduler.py, pooled_models.py); other architectures, or `batching = false`, decode
each request on its own worker thread with its own cache (decode.py), and the log says why.
Chunks cross from those threads to the event loop through a typed ChunkChannel. Prompt limits,
admission, usage and health are the shared engine lifecycle's (engine_lifecycle.py). Knows
nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from services.common.config import TierConfig
from services.common.cpu_priority import (
    lower_this_thread,
    start_priority_executor,
    this_thread_nice,
)
from services.common.errors import Overloaded
from services.tier.batch_scheduler import BatchScheduler
from services.tier.chunk_channel import ChunkChannel
from services.tier.chunking import ChunkAssembler, ChunkSink
from services.tier.decode import decode_steps
from services.tier.engine import GenerationChunk
from services.tier.engine_lifecycle import EngineLifecycle, ModelFootprint
from services.tier.kv_pool import KvCachePool, PoolFull
from services.tier.linear_kernels import LayoutChoice
from services.tier.model_fingerprint import folder_fingerprint
from services.tier.model_loading import LoadedModel, load_causal_lm
from services.tier.pooled_models import layout_extra_bytes, pooled_passes
from services.tier.prepared_request import PreparedRequest, PromptFormat, held_back_entries
from services.tier.scheduled_request import (
    NO_STEP_OBSERVER,
    LogitsTransform,
    ScheduledRequest,
    StepObserver,
)

log = logging.getLogger(__name__)
# How long a stream that ended waits for the scheduler to free its pool slot (one step, normally)
# before its admission slot is handed on; a slot still held then makes the next request wait.
SLOT_RELEASE_WAIT_S = 5.0


class TorchEngine(EngineLifecycle):
    name = "torch"

    def __init__(
        self,
        config: TierConfig,
        *,
        step_observer: StepObserver = NO_STEP_OBSERVER,
        logits_transform: LogitsTransform | None = None,
    ) -> None:
        """`step_observer` and `logits_transform`: the batch scheduler's seams (see
        batch_scheduler.py), off by default; unused when requests decode one per thread."""
        super().__init__(config)
        self._step_observer = step_observer
        self._logits_transform = logits_transform
        self._loaded: LoadedModel | None = None
        self._pool: KvCachePool | None = None
        self._scheduler: BatchScheduler | None = None
        self._torch_thread: ThreadPoolExecutor | None = None  # loads the model, runs the batch
        self._executor: ThreadPoolExecutor | None = None
        self._stops: dict[str, threading.Event] = {}
        self._kv_used: dict[str, int] = {}  # sequential path: positions per request
        self._kv_peak = 0
        self.startup_s: dict[
            str, float
        ] = {}  # start-up phases in order: weights, weight_layout, ...

    @property
    def batching(self) -> bool:
        return self._scheduler is not None

    @property
    def linear_layout(self) -> LayoutChoice | None:
        """How the batching passes lay out the linear layers, None before start or without
        batching."""
        model = self._loaded.model if self._loaded is not None else None
        return getattr(model, "tiermesh_linear_layout", None)

    def _fingerprint_model(self) -> str:
        return folder_fingerprint(self._config.model_path)

    async def _start_model(self) -> PromptFormat:
        torch.set_num_threads(self._config.torch_threads)
        cfg = self._config
        loop = asyncio.get_running_loop()
        self._torch_thread = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix=f"torch-{cfg.name}",
            initializer=lower_this_thread,
            initargs=(cfg.compute_nice,),
        )
        started = time.perf_counter()
        loaded = await loop.run_in_executor(
            self._torch_thread,
            load_causal_lm,
            cfg.model_path,
            cfg.device,
            cfg.dtype,
            cfg.weights_loading,
        )
        self.startup_s["weights"] = time.perf_counter() - started
        max_len = pool_positions(cfg, loaded.context_length)
        passes = pooled_passes(loaded.model, max_len) if cfg.batching else "batching = false"
        if not isinstance(passes, str):
            loaded = replace(loaded, context_length=max_len)
            started = time.perf_counter()
            await loop.run_in_executor(self._torch_thread, passes.prepare, loaded.model)
            self.startup_s["weight_layout"] = time.perf_counter() - started
            # a batch request paused for a critical one keeps its slot: that many more
            pausable = cfg.critical_slots if cfg.critical_pauses_batch else 0
            slots = cfg.running_slots + pausable
            started = time.perf_counter()
            self._pool = await loop.run_in_executor(
                self._torch_thread, passes.create_pool, loaded.model, slots, max_len
            )
            self.startup_s["kv_pool"] = time.perf_counter() - started
            lane = None
            if cfg.critical_lane:  # at the priority the tier was started at: not lowered
                lane = start_priority_executor(f"critical-{cfg.name}")
            self._scheduler = BatchScheduler(
                loaded,
                passes,
                self._pool,
                cfg.prefill_tokens_per_step,
                observer=self._step_observer,
                logits_transform=self._logits_transform,
                critical_lane=lane,
            )
            started = time.perf_counter()
            await loop.run_in_executor(self._torch_thread, self._scheduler.warm_up)
            await asyncio.to_thread(self._scheduler.warm_up_lane)
            self.startup_s["warm_up"] = time.perf_counter() - started
            self._scheduler.start(self._torch_thread)
            self._admission.pausable = pausable
            lane_nice = (
                None if lane is None else await asyncio.wrap_future(lane.submit(this_thread_nice))
            )
            log.info(
                "tier %s: continuous batching (%s) over a KV pool of %d slots x %d positions, "
                "%.1f MB; critical lane %s",
                cfg.name,
                passes.architecture,
                slots,
                max_len,
                self._pool.bytes / 1e6,
                "off" if lane is None else f"on (nice {lane_nice})",
            )
        else:
            log.info("tier %s: one decode thread per request (%s)", cfg.name, passes)
            self._executor = ThreadPoolExecutor(
                max_workers=cfg.running_slots,
                thread_name_prefix=f"decode-{cfg.name}",
                initializer=lower_this_thread,
                initargs=(cfg.compute_nice,),
            )
        self._loaded = loaded
        log.info(
            "tier %s: model ready in %.2f s (%s)",
            cfg.name,
            sum(self.startup_s.values()),
            ", ".join(f"{part} {seconds:.2f} s" for part, seconds in self.startup_s.items()),
        )
        vocab = int(loaded.model.get_input_embeddings().num_embeddings)
        return PromptFormat(loaded.tokenizer, loaded.eos_token_ids, loaded.context_length, vocab)

    async def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Reserves the request's pool slot, hands the request to the batch scheduler (or a
        worker thread) and relays its chunks; on early close, stops its decoding within one
        step. Returns only once the scheduler has freed the slot, so the admission slot this
        runs under is handed on with its pool slot free: admission cannot overbook the pool."""
        assert self._loaded is not None
        loop = asyncio.get_running_loop()
        # at most one chunk per generated token, then the end
        channel: ChunkChannel[GenerationChunk] = ChunkChannel(loop, prepared.max_tokens)
        stop = threading.Event()
        assembler = ChunkAssembler(
            self._loaded.tokenizer,
            prepared.tokens_per_chunk,
            prepared.continued,
            prepared.continued_chars,
            detailed=prepared.sampling.top_logprobs is not None,
            held=held_back_entries(prepared, self._loaded.tokenizer),
        )
        released: asyncio.Future[None] | None = None
        if self._scheduler is not None:
            assert self._pool is not None
            try:
                slot = self._pool.acquire()
            except PoolFull as e:  # admission keeps this from happening; refuse, never queue
                raise Overloaded(f"tier {self._config.name}: {e}") from e
            released = loop.create_future()
            on_release = _resolver(loop, released)

            try:
                self._scheduler.submit(
                    ScheduledRequest(
                        prepared, stop, channel, assembler, slot, on_release=on_release
                    )
                )
            except BaseException:
                self._pool.release(slot)
                raise
            self._stops[prepared.request_id] = stop
        else:
            assert self._executor is not None
            self._stops[prepared.request_id] = stop
            loop.run_in_executor(
                self._executor, self._decode_alone, prepared, stop, channel, assembler
            )
        generated = 0
        try:
            async for chunk in channel:
                generated += len(chunk.token_ids)
                self._kv_note(prepared.request_id, len(prepared.prompt_ids) + generated)
                yield chunk
        finally:
            stop.set()
            if self._stops.get(prepared.request_id) is stop:
                del self._stops[prepared.request_id]
            self._kv_used.pop(prepared.request_id, None)
            if released is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(released), SLOT_RELEASE_WAIT_S)

    def _decode_alone(
        self,
        prepared: PreparedRequest,
        stop: threading.Event,
        sink: ChunkSink,
        chunks: ChunkAssembler,
    ) -> None:
        """Runs on a worker thread: decodes one request with its own KV cache."""
        try:
            assert self._loaded is not None
            steps = decode_steps(
                self._loaded.model,
                list(prepared.prompt_ids),
                max_new_tokens=prepared.max_tokens,
                sampling=prepared.sampling,
                eos_token_ids=prepared.eos_token_ids,
                should_stop=stop.is_set,
                top=prepared.sampling.top_logprobs or 0,
            )
            for count, (token, logprob, top) in enumerate(steps, start=1):
                chunk = chunks.add(token, logprob, prepared.finish_after(token, count), top)
                if chunk is not None:
                    sink.put(chunk)
            sink.close()
        except BaseException as e:  # relayed to the consumer, which raises it
            sink.fail(e)

    def _kv_note(self, request_id: str, positions: int) -> None:
        if self._pool is None:
            self._kv_used[request_id] = positions
            self._kv_peak = max(self._kv_peak, sum(self._kv_used.values()))

    async def abort(self, request_id: str) -> None:
        stop = self._stops.get(request_id)
        if stop is not None:
            stop.set()

    def _footprint(self) -> ModelFootprint:
        loaded, pool = self._loaded, self._pool
        if loaded is None:
            return ModelFootprint(model=self._config.model_path.name)
        if pool is not None:
            capacity, used, peak = pool.capacity_tokens, pool.used_tokens, pool.peak_tokens
            pool_bytes = pool.bytes
        else:  # no pool: report the bound the per-request caches can reach
            capacity = self._config.running_slots * loaded.context_length
            used, peak = sum(self._kv_used.values()), self._kv_peak
            pool_bytes = capacity * _kv_bytes_per_token(loaded)
        return ModelFootprint(
            model=loaded.name,
            params=loaded.params,
            weights_bytes=loaded.weights_bytes + layout_extra_bytes(loaded.model),
            kv_pool_capacity_tokens=capacity,
            kv_pool_used_tokens=used,
            kv_pool_peak_tokens=peak,
            kv_pool_bytes=pool_bytes,
            decode_busy_share=self._scheduler.busy.share() if self._scheduler else 0.0,
        )

    async def _stop_model(self) -> None:
        for stop in self._stops.values():
            stop.set()
        if self._scheduler is not None:
            await asyncio.to_thread(self._scheduler.shutdown)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, wait=True)
        if self._torch_thread is not None:
            await asyncio.to_thread(self._torch_thread.shutdown, wait=True)


def _resolver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> Callable[[], None]:
    """A callable any thread may call to resolve `future` on `loop` (once)."""

    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    def from_any_thread() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(resolve)

    return from_any_thread


def pool_positions(config: TierConfig, context_length: int) -> int:
    """Positions per KV-pool slot: `kv_max_len` when set, else the longest sequence the tier
    admits (max_prompt_tokens + max_tokens), never past the model's context. A model with a long
    context (8k) gets a pool sized by what the tier serves, not by what the model could attend."""
    wanted = config.kv_max_len or config.max_prompt_tokens + config.max_tokens
    return min(wanted, context_length)


def _kv_bytes_per_token(loaded: LoadedModel) -> int:
    """Bytes of keys and values one token position takes across all layers (key/value heads
    only, for grouped-query attention)."""
    config = loaded.model.config
    layers = int(getattr(config, "n_layer", getattr(config, "num_hidden_layers", 0)))
    width = int(getattr(config, "n_embd", getattr(config, "hidden_size", 0)))
    heads = int(getattr(config, "n_head", getattr(config, "num_attention_heads", 1)))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or width // heads)
    element = int(next(loaded.model.parameters()).element_size())
    return 2 * layers * kv_heads * head_dim * element
