"""One chat call to the router over its public gRPC API, as the gateway makes it: the caller's
`Authorization` and W3C trace context travel as gRPC metadata, a gRPC failure becomes a
GatewayError, and `cancel()` stops the call upstream (a client that left) and records the call
(its span, `chat <model>`, and gen_ai.client.operation.duration).

Knows the router's stubs and the client SDK's events; nothing of HTTP framing or OpenAI shapes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping

import grpc
from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from tiermesh.client import ChatError, Event, event_from_proto
from tiermesh.client.tracing import end_span, inject_metadata, rpc_attributes
from tiermesh.v1 import router_pb2, router_pb2_grpc

from services.common.deferred_span import DeferredSpan, defer_span
from services.common.genai_conventions import error_type, genai_attributes, span_name
from services.common.telemetry import tracer, tracing_on
from services.gateway.errors import GatewayError, openai_param

TRACE_HEADERS = ("traceparent", "tracestate")
EMPTY_CONTEXT = Context()  # no trace context to pass on


def call_metadata(headers: Mapping[str, str], context: Context) -> list[tuple[str, str]]:
    """gRPC metadata of a router call: `authorization` passed through as given, and the trace
    context `context` (which continues the caller's `traceparent`)."""
    metadata = inject_metadata(context) if context is not EMPTY_CONTEXT else []
    authorization = headers.get("authorization")
    if authorization:
        metadata.append(("authorization", authorization))
    return metadata


def start_span(
    headers: Mapping[str, str], model: str, user: str
) -> tuple[DeferredSpan | trace.Span | None, Context]:
    """The CLIENT span of the router call and the context that carries it to the router. Its
    parent is the request's current span when the web framework traces requests itself, else
    the caller's `traceparent`; with no tracer installed, the caller's context goes on as is
    (and nothing is built for a span). The span is deferred where the tracer allows it: its
    context goes out with the call and RouterChat builds it once the call is on its way."""
    if not tracing_on():
        carrier = {name: headers[name] for name in TRACE_HEADERS if name in headers}
        return None, propagate.extract(carrier) if carrier else EMPTY_CONTEXT
    if trace.get_current_span().get_span_context().is_valid:
        parent = context_api.get_current()
    else:
        carrier = {name: headers[name] for name in TRACE_HEADERS if name in headers}
        parent = propagate.extract(carrier)
    attributes = {**rpc_attributes("tiermesh.v1.RouterService/Chat"), **genai_attributes(model)}
    if user:
        attributes["gen_ai.openai.request.user"] = user
    name, kind = span_name(model), trace.SpanKind.CLIENT
    deferred = defer_span(name, parent, kind, attributes)
    if deferred is not None:
        return deferred, deferred.context
    span = tracer().start_span(name, context=parent, kind=kind, attributes=attributes)
    if not span.get_span_context().is_valid:
        return None, parent
    return span, trace.set_span_in_context(span, parent)


# records one finished router call: (seconds, GenAI attributes)
OperationRecorder = Callable[[float, dict[str, str]], None]


class RouterChat:
    """A started Chat call; read `first()` then `rest()`; `cancel()` is safe at any time. The
    call's GenAI request model is `model` (the OpenAI model name asked for); its response model
    is the router's Final.model."""

    def __init__(
        self,
        stub: router_pb2_grpc.RouterServiceStub,
        request: router_pb2.ChatRequest,
        metadata: list[tuple[str, str]],
        timeout_s: float,
        retry_after_s: int,
        span: DeferredSpan | trace.Span | None = None,
        model: str = "",
        record: OperationRecorder | None = None,
    ) -> None:
        self._started = time.perf_counter()
        self._call = stub.Chat(request, timeout=timeout_s, metadata=metadata)
        self._retry_after_s = retry_after_s
        self._span = span  # a DeferredSpan until first() or cancel() builds it
        self._code = "CANCELLED"
        self._model = model
        self._response_model = ""
        self._record = record

    async def first(self) -> Event:
        """The first event (the route decision); raises GatewayError if the router refused."""
        if isinstance(self._span, DeferredSpan):
            await asyncio.sleep(0)  # one turn of the loop: grpc sends the call
            self._span = self._span.start()  # built while the router works on the call
        event = await self.next()
        if event is None:
            raise GatewayError(
                502, "the router ended the chat without any event", code="bad_gateway"
            )
        return event

    async def next(self) -> Event | None:
        """The next event, None at the end of the stream; a gRPC failure raises GatewayError."""
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as e:
            self._code = e.code().name
            raise self._error(e) from None
        if message is grpc.aio.EOF:
            self._code = "OK"
            return None
        if message.HasField("final"):
            self._response_model = message.final.model
        return event_from_proto(message)

    async def rest(self) -> AsyncIterator[Event]:
        """The events after those already read."""
        while (event := await self.next()) is not None:
            yield event

    def cancel(self) -> None:
        """Cancels the router call if it still runs; the first time, ends the request's span
        and records the call's duration."""
        self._call.cancel()
        if isinstance(self._span, DeferredSpan):
            self._span = self._span.start()
        if self._span is not None:
            if self._response_model:
                self._span.set_attribute("gen_ai.response.model", self._response_model)
            end_span(self._span, self._code)
            self._span = None
        if self._record is not None:
            attributes = genai_attributes(self._model, self._response_model, error_type(self._code))
            self._record(time.perf_counter() - self._started, attributes)
            self._record = None

    def _error(self, error: grpc.aio.AioRpcError) -> GatewayError:
        """The HTTP error for the router's status; Retry-After from its RetryInfo (rounded up
        to whole seconds), else the config's; the bad field from its BadRequest details."""
        status = ChatError.from_rpc_error(error)
        retry_after = self._retry_after_s
        if status.retry_after_s is not None:
            retry_after = max(1, math.ceil(status.retry_after_s))
        gateway_error = GatewayError.from_status(status.code, status.message, retry_after)
        violations = status.details.field_violations
        if gateway_error.status == 400 and violations:
            gateway_error.param = openai_param(violations[0][0])
        if status.details.reason == "PROMPT_TOO_LONG":  # no tier holds the conversation
            gateway_error.code = "context_length_exceeded"  # OpenAI's code for it
        return gateway_error


def router_stub(channel: grpc.aio.Channel) -> router_pb2_grpc.RouterServiceStub:
    """The stub of the router's RouterService on `channel`: built once per channel, not per
    request."""
    return router_pb2_grpc.RouterServiceStub(channel)
