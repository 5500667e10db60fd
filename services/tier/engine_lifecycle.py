"""What every engine does around decoding, written once: start and health, preparing a request
(prepared_request.py's rules), bounded admission, usage and time-to-first-token bookkeeping, the
recent-TTFT window with its p50/p99, and the load snapshot the servicer reports.

An engine subclasses EngineLifecycle and only loads its model, turns a PreparedRequest into
GenerationChunks (usage left empty), aborts, reports its memory and stops. Knows nothing of
torch, gRPC, protobuf or OpenTelemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace

from services.common.config import TierConfig
from services.common.errors import InvalidArgument, Unavailable
from services.common.percentiles import percentile
from services.tier.admission import Admission
from services.tier.engine import EngineLoad, GenerationChunk, GenerationRequest, GenerationUsage
from services.tier.prepared_request import (
    LENGTH,
    PreparedRequest,
    PromptFormat,
    held_back_entries,
    held_back_text,
    prepare_request,
)
from services.tier.stop_sequences import StopSequences

Clock = Callable[[], float]  # seconds, monotonic (time.perf_counter)


class UsageMeter:
    """One request's usage, measured from when generate() was called (`received`).

    Built when the request gets its running slot (the queue time ends there); observe() sees
    every chunk in order and puts the usage on the last one.
    """

    def __init__(self, prompt_tokens: int, received: float, clock: Clock = time.perf_counter):
        self._clock = clock
        self._received = received
        self.prompt_tokens = prompt_tokens
        self.queue_ms = self._since_received()
        self.ttft_ms: float | None = None  # set by the first chunk that carries a token
        self.completion_tokens = 0

    def _since_received(self) -> float:
        return (self._clock() - self._received) * 1000

    def observe(self, chunk: GenerationChunk) -> GenerationChunk:
        """Counts the chunk's tokens; returns it, with usage when it is the last one."""
        self.completion_tokens += len(chunk.token_ids)
        if self.ttft_ms is None and chunk.token_ids:
            self.ttft_ms = self._since_received()
        if chunk.finish_reason is None:
            return chunk
        usage = GenerationUsage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            queue_ms=self.queue_ms,
            ttft_ms=self.ttft_ms or 0.0,
            total_ms=self._since_received(),
            engine_phases=chunk.engine_phases,
        )
        return replace(chunk, usage=usage)


class TtftWindow:
    """The most recent times to first token (ms): p50 is their median, p99 the nearest-rank
    99th percentile (services.common.percentiles); both 0.0 while there are none."""

    def __init__(self, size: int = 256) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, ttft_ms: float) -> None:
        self._values.append(ttft_ms)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def p50(self) -> float:
        return statistics.median(self._values) if self._values else 0.0

    @property
    def p99(self) -> float:
        value = percentile(self._values, 0.99)
        return 0.0 if value is None else value


@dataclass(frozen=True)
class ModelFootprint:
    """What an engine reports of its model and KV cache in the load snapshot."""

    model: str  # the model's name
    params: int = 0  # 0 = not known to this engine
    weights_bytes: int = 0
    kv_pool_capacity_tokens: int = 0
    kv_pool_used_tokens: int = 0
    kv_pool_peak_tokens: int = 0
    kv_pool_bytes: int = 0
    decode_busy_share: float = 0.0  # share of the last seconds the decode loop worked; 0 = n/a
    # an engine with its own scheduler (vllm): what it runs and holds unscheduled, and its
    # prefix cache's hit rate over recent requests; 0 = n/a
    engine_running: int = 0
    engine_waiting: int = 0
    prefix_cache_hit_rate: float = 0.0


class EngineLifecycle(ABC):
    """The Engine protocol (engine.py) around a subclass's decoder.

    Like the protocol, every method runs on the tier's event loop. Subclasses set `name` and
    implement _start_model, _decode, abort, _footprint and _stop_model.
    """

    name: str
    per_token_detail = True  # whether its chunks can carry sampling.top_logprobs' entries

    def __init__(self, config: TierConfig) -> None:
        self._config = config
        self._admission = Admission(
            config.max_running,
            config.max_queued,
            max_wait_s=config.max_wait_s,
            critical_reserve=config.critical_reserve,
        )
        self._prompt_format: PromptFormat | None = None  # set once the model is loaded
        self._ttfts = TtftWindow()
        self._completed = 0
        self._closing = False
        self._model_name = ""  # the loaded model's name, put on the chunks that answer
        self._model_fingerprint = ""  # and its checkpoint's fingerprint

    async def start(self) -> None:
        """Loads the model. Raises on failure; the tier stays NOT_SERVING."""
        self._prompt_format = await self._start_model()
        self._model_name = self._footprint().model
        self._model_fingerprint = await asyncio.to_thread(self._fingerprint_model)

    def _fingerprint_model(self) -> str:
        """The loaded checkpoint's fingerprint (model_fingerprint.py); "" for an engine with no
        model folder. Runs in a thread once the model is loaded."""
        return ""

    def _finished_continuation(self, prepared: PreparedRequest, received: float) -> GenerationChunk:
        """The last chunk of an answer whose tokens the caller sent all of (its stream broke
        before the tier's last chunk): nothing to decode, only the text still held back and the
        usage, finished by length."""
        assert self._prompt_format is not None
        self._completed += 1
        text = held_back_text(prepared, self._prompt_format)
        entries = held_back_entries(prepared, self._prompt_format.tokenizer)
        last = GenerationChunk((), text, (), finish_reason=LENGTH, token_logprobs=entries)
        if prepared.sampling.stop:  # the held-back text may hold (the rest of) a stop sequence
            last = StopSequences(prepared.sampling.stop).apply(last)
        return UsageMeter(len(prepared.prompt_ids), received).observe(last)

    def _named(self, chunk: GenerationChunk) -> GenerationChunk:
        """The chunk naming the model that answers it, and its checkpoint."""
        return replace(chunk, model=self._model_name, model_fingerprint=self._model_fingerprint)

    def check_health(self) -> None:
        if self._prompt_format is None:
            raise Unavailable(f"tier {self._config.name}: model not loaded")
        if self._closing:
            raise Unavailable(f"tier {self._config.name}: shutting down")

    def prepare(self, request: GenerationRequest) -> PreparedRequest:
        """The request rendered, tokenised and checked against the tier's limits."""
        self.check_health()
        assert self._prompt_format is not None
        if request.sampling.top_logprobs is not None and not self.per_token_detail:
            raise InvalidArgument(
                f"sampling.top_logprobs: per-token detail is not served by the {self.name} "
                "engine (use a torch tier)"
            )
        return prepare_request(
            request,
            self._prompt_format,
            max_prompt_tokens=self._config.max_prompt_tokens,
            tokens_per_chunk=self._config.tokens_per_chunk,
        )

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Steps: check health, prepare the request (raises InvalidArgument), wait for a running
        slot in the bounded queue (raises Overloaded past it, or at once when the queue's
        expected wait exceeds the request's deadline or the longest wait), check health again,
        then relay the decoder's chunks, noting the first token's time and putting usage on the
        last chunk; with stop sequences, the text is cut at the first (stop_sequences.py) and
        the decoder's stream closed there. Closing the stream early closes the decoder's, which
        stops its work. A stream
        that the engine's shutdown ended before its last chunk raises Unavailable."""
        received = time.perf_counter()
        prepared = self.prepare(request)
        if prepared.max_tokens == 0:  # a continuation of an answer that is max_tokens long
            yield self._named(self._finished_continuation(prepared, received))
            return
        deadline_s = request.deadline_s
        if deadline_s is not None:
            deadline_s -= time.perf_counter() - received
        async with self._admission.slot(deadline_s, request.priority) as holder:
            self.check_health()
            meter = UsageMeter(len(prepared.prompt_ids), received)
            finished = False
            stops = StopSequences(prepared.sampling.stop) if prepared.sampling.stop else None
            if self._admission.pausable:
                prepared = replace(prepared, paused=lambda: holder.paused)
            stream = self._decode(prepared)
            async with contextlib.aclosing(stream):
                async for decoded in stream:
                    if stops is not None:
                        decoded = stops.apply(decoded)
                    first = meter.ttft_ms is None
                    chunk = meter.observe(decoded)
                    if first and meter.ttft_ms is not None:
                        self._ttfts.add(meter.ttft_ms)
                        chunk = self._named(chunk)
                    if chunk.finish_reason is not None:
                        self._completed += 1
                        chunk = self._named(chunk)
                        finished = True
                    yield chunk
                    if finished:  # a stop sequence ends it before the engine does
                        break
            if not finished and self._closing:  # stopped under it: never end as if complete
                raise Unavailable(
                    f"tier {self._config.name}: the model {self._model_name} stopped before "
                    "the answer was complete"
                )

    def load(self) -> EngineLoad:
        """The current load snapshot. Cheap; safe to call often."""
        cfg, footprint = self._config, self._footprint()
        return EngineLoad(
            model=footprint.model,
            device=cfg.device,
            serving=self._prompt_format is not None and not self._closing,
            running=self._admission.running,
            max_running=cfg.max_running,
            queued=self._admission.queued,
            max_queued=cfg.max_queued,
            ttft_ms_p50=self._ttfts.p50,
            ttft_ms_p99=self._ttfts.p99,
            kv_pool_capacity_tokens=footprint.kv_pool_capacity_tokens,
            kv_pool_used_tokens=footprint.kv_pool_used_tokens,
            kv_pool_peak_tokens=footprint.kv_pool_peak_tokens,
            weights_bytes=footprint.weights_bytes,
            kv_pool_bytes=footprint.kv_pool_bytes,
            completed=self._completed,
            rejected=self._admission.rejected,
            params=footprint.params,
            max_prompt_tokens=cfg.max_prompt_tokens,
            max_tokens=cfg.max_tokens,
            decode_busy_share=footprint.decode_busy_share,
            model_fingerprint=self._model_fingerprint,
            expected_wait_ms=self._admission.expected_wait_s() * 1000,
            max_wait_ms=self._admission.max_wait_s * 1000,
            engine_running=footprint.engine_running,
            engine_waiting=footprint.engine_waiting,
            prefix_cache_hit_rate=footprint.prefix_cache_hit_rate,
            queued_batch=self._admission.queued_batch,
            paused=self._admission.paused,
        )

    async def shutdown(self) -> None:
        """Refuses new requests, then aborts what is running and frees the model."""
        self._closing = True
        await self._stop_model()

    @abstractmethod
    async def _start_model(self) -> PromptFormat:
        """Loads the model; returns what preparing requests needs to know about it."""

    @abstractmethod
    def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Streams the request's tokens as chunks without usage; the last has finish_reason
        (prepared.finish_after decides it). Closed early, it must stop the request's work."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stops a request's generation; its stream ends. Unknown ids are ignored."""

    @abstractmethod
    def _footprint(self) -> ModelFootprint:
        """The model and KV-cache numbers of the load snapshot (callable before start)."""

    @abstractmethod
    async def _stop_model(self) -> None:
        """Aborts what is running and frees the model (new requests are already refused)."""
