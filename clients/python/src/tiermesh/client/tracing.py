"""Client-side tracing that works with or without OpenTelemetry installed.

With `opentelemetry-api` importable, a chat gets a CLIENT span and its W3C trace context travels
to the router in gRPC metadata; what happens to the span (exported or dropped) is up to the SDK
the application configured. Without it, every function here does nothing. The server reuses
`inject_metadata` and `end_span` so there is one implementation of each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # pragma: no cover - exercised by the client's own torch-free venv test
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context

INSTRUMENTATION = "tiermesh"
# (provider, its tracer): get_tracer builds a new tracer each call (tens of microseconds, and
# a warnings filter), so one is kept per installed provider
_tracer_cache: tuple[Any, Any] | None = None
GRPC_STATUS_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}


def inject_metadata(context: Context | None = None) -> list[tuple[str, str]]:
    """gRPC metadata carrying a trace context (traceparent, tracestate): `context`, or the
    current one. Empty without OpenTelemetry."""
    if propagate is None:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return list(carrier.items())


def rpc_attributes(method: str) -> dict[str, str]:
    """The RPC semantic conventions' attributes of a gRPC span: `rpc.system.name` and the
    fully-qualified `rpc.method` ("tiermesh.v1.RouterService/Chat")."""
    return {"rpc.system.name": "grpc", "rpc.method": method}


def end_span(span: Any, code_name: str, message: str = "") -> None:
    """Ends a span with the gRPC status it finished with (OK, CANCELLED, UNAVAILABLE, ...):
    `rpc.response.status_code` is the status name, and `error.type` too unless it is OK."""
    if span is None or trace is None:
        return
    code_name = code_name if code_name in GRPC_STATUS_CODES else "UNKNOWN"
    span.set_attribute("rpc.response.status_code", code_name)
    if code_name != "OK":
        span.set_attribute("error.type", code_name)
    if code_name == "OK":
        span.set_status(trace.Status(trace.StatusCode.OK))
    else:
        detail = f"{code_name}: {message}" if message else code_name
        span.set_status(trace.Status(trace.StatusCode.ERROR, detail))
    span.end()


def tiermesh_tracer() -> Any:
    """The tracer of this library under the installed tracer provider (kept until the provider
    changes); requires opentelemetry-api."""
    global _tracer_cache
    provider = trace.get_tracer_provider()
    cached = _tracer_cache
    if cached is None or cached[0] is not provider:
        cached = _tracer_cache = (provider, trace.get_tracer(INSTRUMENTATION))
    return cached[1]


def start_chat_span(mode: str) -> tuple[Any, list[tuple[str, str]]]:
    """The client span of one chat (None without OpenTelemetry) and the metadata carrying it."""
    if trace is None:
        return None, []
    span = tiermesh_tracer().start_span(
        "chat",
        kind=trace.SpanKind.CLIENT,
        attributes={
            **rpc_attributes("tiermesh.v1.RouterService/Chat"),
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "tiermesh",
            "tiermesh.mode": mode,
        },
    )
    return span, inject_metadata(trace.set_span_in_context(span))
