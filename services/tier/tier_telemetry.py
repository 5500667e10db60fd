"""Traces and metrics of one tier: the Generate server span (`chat <tier>`, GenAI and RPC
attributes), the engine's queue / prefill / decode spans (timed from the request's usage), the
request duration, TTFT and time-per-token histograms with the GenAI attributes, and load gauges.
Knows OpenTelemetry and the engine's plain types; not gRPC.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind

from services.common.genai_conventions import (
    SERVER_DURATION,
    error_type,
    genai_attributes,
    span_name,
)
from services.common.telemetry import end_span, extract_context, meter, rpc_attributes, tracer
from services.tier.engine import Engine, EnginePhases, GenerationRequest, GenerationUsage

MS = 1_000_000  # nanoseconds per millisecond


class TierTelemetry:
    def __init__(self, tier: str, engine: Engine) -> None:
        self._tier = tier
        self._engine = engine
        m = meter()
        self.ttft = m.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s", description="Time to first token"
        )
        self.tpot = m.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s", description="Time per output token"
        )
        self.duration = m.create_histogram(
            SERVER_DURATION.name, unit="s", description=SERVER_DURATION.description
        )
        self.requests = m.create_counter(
            "tiermesh.tier.requests", description="Generate calls by final gRPC status"
        )
        for name, field, description in (
            ("tiermesh.tier.queue_depth", "queued", "Requests waiting for a running slot"),
            ("tiermesh.tier.running", "running", "Requests decoding"),
            ("tiermesh.tier.kv_pool.used", "kv_pool_used_tokens", "KV positions in use"),
            ("tiermesh.tier.kv_pool.capacity", "kv_pool_capacity_tokens", "KV positions"),
            ("tiermesh.tier.decode.busy", "decode_busy_share", "Decode loop busy share, last 5 s"),
        ):
            m.create_observable_gauge(name, callbacks=[self._gauge(field)], description=description)

    def _gauge(self, field: str) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            yield Observation(getattr(self._engine.load(), field), {"tiermesh.tier": self._tier})

        return observe

    def start(
        self, metadata: Sequence[tuple[str, Any]] | None, request_id: str, start_ns: int
    ) -> trace.Span:
        return tracer().start_span(
            span_name(self._tier),
            context=extract_context(metadata),
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={
                **rpc_attributes("tiermesh.v1.TierService/Generate"),
                **genai_attributes(self._tier),
                "tiermesh.tier": self._tier,
                "tiermesh.request_id": request_id,
            },
        )

    def finish(
        self,
        span: trace.Span,
        request: GenerationRequest | None,
        received_ns: int,
        first_token_ns: int | None,
        response_model: str,
        usage: GenerationUsage | None,
        finish_reason: str | None,
        status: str,
        message: str = "",
    ) -> None:
        """Adds the engine phase spans and metrics, then ends the server span. `response_model`
        is the model that answered (gen_ai.response.model), "" when it produced no token."""
        now = time.time_ns()
        attributes = {
            **genai_attributes(self._tier, response_model, error_type(status)),
            "tiermesh.tier": self._tier,
        }
        if response_model:
            span.set_attribute("gen_ai.response.model", response_model)
        if request is not None:
            span.set_attribute("gen_ai.request.max_tokens", request.max_tokens)
            span.set_attribute("gen_ai.request.temperature", request.sampling.temperature)
        context = trace.set_span_in_context(span)
        if usage is not None:
            queued = received_ns + int(usage.queue_ms * MS)
            first = received_ns + int(usage.ttft_ms * MS)
            last = received_ns + int(usage.total_ms * MS)
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            inside = engine_phase_attributes(usage.engine_phases)
            self._phase("engine queue", context, received_ns, queued)
            self._phase("engine prefill", context, queued, first, attributes=inside["prefill"])
            self._phase(
                "engine decode", context, first, last, usage.completion_tokens, inside["decode"]
            )
            self.ttft.record(usage.ttft_ms / 1000, attributes)
            if usage.completion_tokens > 1:
                per_token = (usage.total_ms - usage.ttft_ms) / (usage.completion_tokens - 1)
                self.tpot.record(per_token / 1000, attributes)
        elif first_token_ns is not None:  # cut short: the split of queue and prefill is unknown
            self._phase("engine queue+prefill", context, received_ns, first_token_ns)
            self._phase("engine decode", context, first_token_ns, now)
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        self.duration.record((now - received_ns) / 1e9, attributes)
        self.requests.add(1, {"tiermesh.tier": self._tier, "rpc.response.status_code": status})
        end_span(span, status, message)

    def _phase(
        self,
        name: str,
        context: Any,
        start_ns: int,
        end_ns: int,
        tokens: int | None = None,
        attributes: dict[str, float | int] | None = None,
    ) -> None:
        span = tracer().start_span(name, context=context, start_time=start_ns)
        span.set_attribute("tiermesh.tier", self._tier)
        if tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", tokens)
        if attributes:
            span.set_attributes(attributes)
        span.end(end_time=max(start_ns, end_ns))


def engine_phase_attributes(phases: EnginePhases | None) -> dict[str, dict[str, float | int]]:
    """What an engine measured inside itself, as attributes of the tier's "engine prefill" span
    (its scheduler's wait, its prefill, prompt tokens its prefix cache held) and "engine decode"
    span (its decode, preemptions); none without them."""
    if phases is None:
        return {"prefill": {}, "decode": {}}
    return {
        "prefill": {
            "tiermesh.engine.scheduler_wait_ms": round(phases.scheduler_wait_ms, 3),
            "tiermesh.engine.prefill_ms": round(phases.prefill_ms, 3),
            "tiermesh.engine.cached_prompt_tokens": phases.cached_prompt_tokens,
        },
        "decode": {
            "tiermesh.engine.decode_ms": round(phases.decode_ms, 3),
            "tiermesh.engine.preemptions": phases.preemptions,
        },
    }
