"""TierService over gRPC: validates requests, relays an engine's chunks, reports its load.

The only module of the tier that speaks gRPC and protobuf; the engine sees plain types.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.errors import InvalidArgument, TiermeshError
from services.common.genai_conventions import model_id
from services.common.status_details import abort_error
from services.common.validation import (
    MAX_TIER_PROMPT_CHARS,
    check_max_tokens,
    check_request_id,
    check_sampling,
    conversation,
)
from services.tier.admin_servicer import swap_to_proto
from services.tier.engine import (
    Engine,
    GenerationRequest,
    GenerationUsage,
    Sampling,
    TokenLogprob,
)
from services.tier.model_swap import SwapRecord
from services.tier.queue_order import BATCH, CRITICAL, INTERACTIVE
from services.tier.startup_record import StartupRecord
from services.tier.tier_telemetry import TierTelemetry
from services.tier.utilisation import RecentUtilisation

log = logging.getLogger(__name__)


def sampling_from_proto(params: common_pb2.SamplingParams) -> Sampling:
    """Validated sampling settings; raises InvalidArgument naming the bad field."""
    check_sampling(params)
    return Sampling(
        temperature=params.temperature,
        top_p=params.top_p if params.top_p > 0 else 1.0,
        top_k=params.top_k,
        seed=params.seed or None,
        stop=tuple(params.stop),
        top_logprobs=params.top_logprobs if params.HasField("top_logprobs") else None,
    )


def token_logprobs_to_proto(
    entries: tuple[TokenLogprob, ...],
) -> list[common_pb2.TokenLogprob]:
    return [
        common_pb2.TokenLogprob(
            text=e.text,
            logprob=e.logprob,
            top=[
                common_pb2.TopLogprob(token_id=t.token_id, text=t.text, logprob=t.logprob)
                for t in e.top
            ],
        )
        for e in entries
    ]


def usage_to_proto(usage: GenerationUsage) -> common_pb2.Usage:
    return common_pb2.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        queue_ms=usage.queue_ms,
        ttft_ms=usage.ttft_ms,
        total_ms=usage.total_ms,
    )


QUEUE_PRIORITIES: dict[int, str] = {
    tier_pb2.QUEUE_PRIORITY_UNSPECIFIED: INTERACTIVE,
    tier_pb2.QUEUE_PRIORITY_INTERACTIVE: INTERACTIVE,
    tier_pb2.QUEUE_PRIORITY_BATCH: BATCH,
    tier_pb2.QUEUE_PRIORITY_CRITICAL: CRITICAL,
}


def _queue_priority(value: int) -> str:
    try:
        return QUEUE_PRIORITIES[value]
    except KeyError:
        raise InvalidArgument(f"queue_priority: unknown value {value}") from None


class OtherModel(TiermeshError):
    """A continuation of tokens another model generated; it must go where that model serves."""

    status = "FAILED_PRECONDITION"


class TierServicer(tier_pb2_grpc.TierServiceServicer):
    def __init__(self, tier: str, engine: Engine, max_tokens: int) -> None:
        self._tier = tier
        self._engine = engine
        self._max_tokens = max_tokens
        self._telemetry = TierTelemetry(tier, engine)
        self.startup = StartupRecord()  # filled in by the server once the tier is SERVING
        self.last_swap: Callable[[], SwapRecord | None] = lambda: None  # the server's, if any
        self._recent = RecentUtilisation()

    def _request(
        self, request: tier_pb2.GenerateRequest, deadline_s: float | None = None
    ) -> GenerationRequest:
        if not request.request_id:
            raise InvalidArgument("request_id: required")
        check_request_id(request.request_id)
        # Roles, counts and sizes as the router checks them: a tier can be called directly.
        conversation(list(request.messages), request.prompt, MAX_TIER_PROMPT_CHARS)
        messages = tuple((m.role, m.content) for m in request.messages)
        check_max_tokens(request.max_tokens, self._max_tokens)
        if request.tokens_per_chunk > 64:
            raise InvalidArgument(
                f"tokens_per_chunk: must be in [0, 64], got {request.tokens_per_chunk}"
            )
        return GenerationRequest(
            request_id=request.request_id,
            prompt=request.prompt,
            messages=messages,
            max_tokens=request.max_tokens,
            sampling=sampling_from_proto(request.sampling),
            tokens_per_chunk=request.tokens_per_chunk,
            deadline_s=deadline_s,
            continue_ids=tuple(request.continue_token_ids),
            continue_chars=(
                request.continue_text_chars if request.HasField("continue_text_chars") else None
            ),
            continue_logprobs=tuple(request.continue_logprobs),
            fit_to_context=request.fit_max_tokens_to_context,
            priority=_queue_priority(request.queue_priority),
        )

    async def Generate(
        self, request: tier_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tier_pb2.GenerateChunk]:
        received_ns = time.time_ns()
        span = self._telemetry.start(context.invocation_metadata(), request.request_id, received_ns)
        generation: GenerationRequest | None = None
        first_token_ns: int | None = None
        usage: GenerationUsage | None = None
        finish: str | None = None
        answering = ""  # the model that answers, from the engine's chunks (it may be swapped)
        status, message = "OK", ""
        try:
            generation = self._request(request, context.time_remaining())
            self._check_continued_model(request)  # then at once to the engine checked
            stream = self._engine.generate(generation)
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for chunk in stream:
                    if first_token_ns is None:
                        first_token_ns = time.time_ns()
                    usage, finish = chunk.usage or usage, chunk.finish_reason or finish
                    answering = chunk.model or answering
                    self._recent.add_tokens(len(chunk.token_ids))
                    yield tier_pb2.GenerateChunk(
                        token_ids=chunk.token_ids,
                        text=chunk.text,
                        logprobs=chunk.logprobs,
                        finish_reason=chunk.finish_reason or "",
                        usage=usage_to_proto(chunk.usage) if chunk.usage else None,
                        model=self._model_id(answering) if chunk.model else "",
                        model_fingerprint=chunk.model_fingerprint,  # set with model
                        token_logprobs=token_logprobs_to_proto(chunk.token_logprobs)
                        if chunk.token_logprobs
                        else None,
                        stop_sequence=chunk.stop_sequence,
                    )
        except TiermeshError as e:
            status, message = e.status, str(e)
            await abort_error(context, e)
        except (asyncio.CancelledError, GeneratorExit):
            status = "CANCELLED"
            await self._engine.abort(request.request_id)
            raise
        except Exception as e:
            if not isinstance(e, grpc.aio.AbortError):
                status, message = "INTERNAL", str(e)
            raise
        finally:
            self._telemetry.finish(
                span,
                generation,
                received_ns,
                first_token_ns,
                self._model_id(answering) if first_token_ns is not None else "",
                usage,
                finish,
                status,
                message,
            )

    def _check_continued_model(self, request: tier_pb2.GenerateRequest) -> None:
        """A continuation of another model's tokens (continue_model) is refused: the ids would
        be read with this model's tokenizer."""
        if not request.continue_token_ids or not request.continue_model:
            return
        load = self._engine.load()
        serving = self._model_id(load.model)
        if request.continue_model != serving:
            raise OtherModel(
                f"continue_model: the tokens are {request.continue_model}'s, this replica serves "
                f"{serving}"
            )
        theirs, ours = request.continue_model_fingerprint, load.model_fingerprint
        if theirs and ours and theirs != ours:
            raise OtherModel(
                f"continue_model_fingerprint: the tokens are checkpoint {theirs}'s of {serving}, "
                f"this replica serves checkpoint {ours} under that name"
            )

    def _model_id(self, model: str) -> str:
        """`<tier>/<model>` of the model that answered (the serving one if no chunk said)."""
        return model_id(self._tier, model or self._engine.load().model)

    def _status(self) -> tier_pb2.TierStatus:
        load = self._engine.load()
        self._recent.sample_pool(load.kv_pool_used_tokens, load.kv_pool_capacity_tokens)
        return tier_pb2.TierStatus(
            tier=self._tier,
            model=load.model,
            engine=self._engine.name,
            device=load.device,
            serving=load.serving,
            running=load.running,
            max_running=load.max_running,
            queued=load.queued,
            max_queued=load.max_queued,
            recent_ttft_ms_p50=load.ttft_ms_p50,
            recent_ttft_ms_p99=load.ttft_ms_p99,
            kv_pool_capacity_tokens=load.kv_pool_capacity_tokens,
            kv_pool_used_tokens=load.kv_pool_used_tokens,
            kv_pool_peak_tokens=load.kv_pool_peak_tokens,
            weights_bytes=load.weights_bytes,
            kv_pool_bytes=load.kv_pool_bytes,
            completed=load.completed,
            rejected=load.rejected,
            max_tokens=load.max_tokens,
            max_prompt_tokens=load.max_prompt_tokens,
            params=load.params,
            decode_busy_share=load.decode_busy_share,
            model_id=model_id(self._tier, load.model),
            model_fingerprint=load.model_fingerprint,
            expected_wait_ms=load.expected_wait_ms,
            max_wait_ms=load.max_wait_ms,
            engine_running=load.engine_running,
            engine_waiting=load.engine_waiting,
            prefix_cache_hit_rate=load.prefix_cache_hit_rate,
            queued_batch=load.queued_batch,
            paused=load.paused,
            startup_phases=[
                tier_pb2.StartupPhase(name=name, seconds=seconds)
                for name, seconds in self.startup.phases
            ],
            startup_s=self.startup.total_s,
            weights_loading=self.startup.weights_loading,
            recent_tokens_per_s=self._recent.tokens_per_s(),
            recent_kv_pool_use_share=self._recent.kv_pool_use_share(),
            last_swap=swap_to_proto(swap) if (swap := self.last_swap()) else None,
        )

    async def GetStatus(
        self, request: tier_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> tier_pb2.TierStatus:
        return self._status()

    async def WatchLoad(
        self, request: tier_pb2.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tier_pb2.TierStatus]:
        interval_ms = request.interval_ms or 1000
        if not 50 <= interval_ms <= 60000:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"interval_ms: must be in [50, 60000], got {interval_ms}",
            )
        while True:
            yield self._status()
            await asyncio.sleep(interval_ms / 1000)
