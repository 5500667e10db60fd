"""A span whose trace context goes on the wire before the span is built: its ids are reserved and
the sampler asked up front (a few microseconds), the call it describes is sent with that
context, and the span itself (the SDK's object, its attributes, its processors) is built a moment
later with the same ids and its true start time, so building it does not delay the call.

Why: a client span is built before its call only so that the call can carry its `traceparent`.
On a busy two-core machine building one costs ~0.1-0.15 ms at the moment a request arrives (the
SDK's code is cold then; 13 us in a warm loop), all of it on the request's first-token path.

Needs this process's TracerProvider to draw ids from `ReservedIdGenerator` (setup_telemetry
installs it); with any other provider `defer_span` returns None and callers start the span at
once, as before. The sampler sees the same inputs both times (no attributes, no links), so the
context sent and the span built agree for every sampler that decides from those.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from tiermesh.client.tracing import tiermesh_tracer

# (trace id, or 0 to draw one; span id) for the span being started inside DeferredSpan.start
_RESERVED: ContextVar[tuple[int, int] | None] = ContextVar("tiermesh_reserved_ids", default=None)


class ReservedIdGenerator(RandomIdGenerator):
    """The SDK's random ids, except for a span started by `DeferredSpan.start`, which gets the
    ids its context already carried on the wire."""

    def generate_span_id(self) -> int:
        reserved = _RESERVED.get()
        return reserved[1] if reserved is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        reserved = _RESERVED.get()
        if reserved is not None and reserved[0]:
            return reserved[0]
        return super().generate_trace_id()


class DeferredSpan:
    """A span not yet built: `context` (the parent plus this span's ids) is what the call
    carries; `start()` builds the span with those ids, once, and returns it."""

    def __init__(
        self,
        name: str,
        parent: Context,
        kind: SpanKind,
        span_context: SpanContext,
        reserved: tuple[int, int],
        attributes: dict[str, Any],
    ) -> None:
        self.name = name
        self.parent = parent
        self.kind = kind
        self.context = trace.set_span_in_context(NonRecordingSpan(span_context), parent)
        self.attributes = attributes
        self._reserved = reserved  # what ReservedIdGenerator hands out (trace id 0: the parent's)
        self._start_ns = time.time_ns()

    def start(self) -> trace.Span:
        """The span, built now with the reserved ids and the time `defer_span` was called."""
        token = _RESERVED.set(self._reserved)
        try:
            span: trace.Span = tiermesh_tracer().start_span(
                self.name, context=self.parent, kind=self.kind, start_time=self._start_ns
            )
        finally:
            _RESERVED.reset(token)
        if span.is_recording():
            span.set_attributes(self.attributes)
        return span


def defer_span(
    name: str, parent: Context, kind: SpanKind, attributes: dict[str, Any]
) -> DeferredSpan | None:
    """A DeferredSpan named `name` under `parent`, or None when this process's tracer cannot
    reserve ids (no SDK provider, or one not set up by setup_telemetry): then start the span at
    once. The span's start time is now."""
    sdk_tracer = tiermesh_tracer()
    generator = getattr(sdk_tracer, "id_generator", None)
    sampler = getattr(sdk_tracer, "sampler", None)
    if not isinstance(generator, ReservedIdGenerator) or sampler is None:
        return None
    parent_context = trace.get_current_span(parent).get_span_context()
    root = not parent_context.is_valid
    trace_id = generator.generate_trace_id() if root else parent_context.trace_id
    # what the SDK's Tracer.start_span decides, with the inputs `start` will give it
    result = sampler.should_sample(parent, trace_id, name, kind, None, ())
    flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
    random_id = (
        generator.is_trace_id_random() if root else parent_context.trace_flags.random_trace_id
    )
    if random_id:
        flags |= TraceFlags.RANDOM_TRACE_ID
    span_id = generator.generate_span_id()
    span_context = SpanContext(
        trace_id,
        span_id,
        is_remote=False,
        trace_flags=TraceFlags(flags),
        trace_state=result.trace_state,
    )
    reserved = (trace_id if root else 0, span_id)
    return DeferredSpan(name, parent, kind, span_context, reserved, attributes)
