"""The one place that sets up OpenTelemetry for a tiermesh process, from the standard `OTEL_*`
settings, plus the helpers every service uses to carry W3C trace context over gRPC metadata.

Exporters: OTLP over gRPC (traces and metrics) when OTEL_EXPORTER_OTLP_ENDPOINT is set; a
console span exporter when OTEL_TRACES_EXPORTER=console; a JSON-lines span file when
TIERMESH_TRACE_FILE is set (what `tiermesh trace` reads); a Prometheus scrape endpoint when the
service's config gives a metrics port. With none of these, no provider is installed and the
OpenTelemetry API stays a no-op. Services call `setup_telemetry` once and never configure
OpenTelemetry themselves. `tracing_on` and `metrics_on` say whether a provider is installed, so a
hot path can skip building spans, attributes and metric labels that would go nowhere.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from tiermesh.client.tracing import (
    INSTRUMENTATION,
    end_span,
    inject_metadata,
    rpc_attributes,
    tiermesh_tracer,
)

from services.common.deferred_span import ReservedIdGenerator
from services.common.env import metrics_host
from services.common.errors import ConfigError
from services.common.metric_views import histogram_views

__all__ = [
    "end_span",
    "inject_metadata",
    "meter",
    "metrics_on",
    "rpc_attributes",
    "setup_telemetry",
    "tracer",
    "tracing_on",
]

log = logging.getLogger(__name__)


def tracer() -> trace.Tracer:
    """This process's tiermesh tracer (one per installed provider, not one per call)."""
    tracer: trace.Tracer = tiermesh_tracer()
    return tracer


def meter() -> metrics.Meter:
    return metrics.get_meter(INSTRUMENTATION)


_NO_TRACER_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_NO_METER_PROVIDERS = (_ProxyMeterProvider, NoOpMeterProvider)


def tracing_on() -> bool:
    """Whether this process has a tracer provider installed: without one every span is a
    no-op, and what a caller would build for it (names, attributes, links) is wasted."""
    return not isinstance(trace.get_tracer_provider(), _NO_TRACER_PROVIDERS)


def metrics_on() -> bool:
    """Whether this process has a meter provider installed (else every record is a no-op)."""
    return not isinstance(metrics.get_meter_provider(), _NO_METER_PROVIDERS)


def extract_context(metadata: Sequence[tuple[str, Any]] | None) -> Context:
    """The trace context a caller sent in its gRPC metadata (empty context if none)."""
    carrier = {key: str(value) for key, value in (metadata or ())}
    return propagate.extract(carrier)


TRUST_TRACE_CONTEXT_ENV = "TIERMESH_TRUST_TRACE_CONTEXT"


def edge_context(
    metadata: Sequence[tuple[str, Any]] | None,
) -> tuple[Context, list[trace.Link]]:
    """The parent context and links of a span that starts at the mesh's edge (the router's
    Chat), where callers come from outside: their `traceparent`, `tracestate` and `baggage`
    are not trusted unless TIERMESH_TRUST_TRACE_CONTEXT=1. Untrusted, the span starts a new
    trace (an empty context, no baggage) and keeps the caller's span as a link, so the two
    traces can still be joined; trusted, it continues the caller's trace. Inside the mesh
    (router -> tier) `extract_context` continues the trace as before."""
    context = extract_context(metadata)
    if os.environ.get(TRUST_TRACE_CONTEXT_ENV) == "1":
        return context, []
    caller = trace.get_current_span(context).get_span_context()
    return Context(), [trace.Link(caller)] if caller.is_valid else []


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file (what `tiermesh trace` reads).

    Bounded: past max_bytes the file moves to `<path>.1` (replacing the older one) and a new
    one starts. Safe across processes appending to the same file (one write per batch)."""

    def __init__(self, path: str, max_bytes: int = 32 * 1024 * 1024) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span)) + "\n" for span in spans)
        with self._lock:
            try:
                if os.path.getsize(self._path) > self._max_bytes:
                    os.replace(self._path, self._path + ".1")
            except OSError:
                pass
            with open(self._path, "a", encoding="utf-8") as f:
                f.write(lines)
        return SpanExportResult.SUCCESS


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    parent = span.parent
    return {
        "trace_id": format(context.trace_id, "032x") if context else "",
        "span_id": format(context.span_id, "016x") if context else "",
        "parent_id": format(parent.span_id, "016x") if parent else None,
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
        # the spans this one links to (the router's link to an untrusted caller's span)
        "links": [
            {
                "trace_id": format(link.context.trace_id, "032x"),
                "span_id": format(link.context.span_id, "016x"),
            }
            for link in span.links
        ],
    }


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


OTLP_PROTOCOLS = ("grpc", "http/protobuf")
SIGNAL_PROTOCOL_ENV = {  # per signal, over OTEL_EXPORTER_OTLP_PROTOCOL
    "traces": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "metrics": "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
}


def otlp_protocol(signal: str) -> str:
    """OTEL_EXPORTER_OTLP_{signal}_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc, for
    the signal `traces` or `metrics`."""
    env = os.environ
    protocol = env.get(SIGNAL_PROTOCOL_ENV[signal]) or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    if protocol not in OTLP_PROTOCOLS:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not one of {', '.join(OTLP_PROTOCOLS)}"
        )
    return protocol


def _otlp_exporters(protocol: str = "grpc") -> tuple[Any, Any]:
    """The OTLP span and metric exporter classes for `protocol` (grpc or http/protobuf), or a
    ConfigError that says how to repair an environment where another package's copy of the
    OpenTelemetry protos replaced the exporter's own (xds-protos installed after
    opentelemetry-proto does that)."""
    try:
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http import metric_exporter, trace_exporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc import (  # type: ignore[no-redef]
                metric_exporter,
                trace_exporter,
            )
    except ImportError as e:
        import importlib.metadata

        version = importlib.metadata.version("opentelemetry-proto")
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter cannot be imported ({e}); "
            "if xds-protos was installed after opentelemetry-proto, put the exporter's protos "
            f"back: pip install --force-reinstall --no-deps opentelemetry-proto=={version}"
        ) from e
    return trace_exporter.OTLPSpanExporter, metric_exporter.OTLPMetricExporter


def _resource_attributes(service_name: str) -> dict[str, str]:
    """service.namespace tiermesh, and `service_name` unless OTEL_SERVICE_NAME or a
    service.name in OTEL_RESOURCE_ATTRIBUTES names the service (the SDK reads both)."""
    attributes = {"service.namespace": "tiermesh"}
    configured = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    named = os.environ.get("OTEL_SERVICE_NAME") or any(
        pair.split("=", 1)[0].strip() == "service.name" for pair in configured.split(",")
    )
    if not named:
        attributes["service.name"] = service_name
    return attributes


@dataclass
class Telemetry:
    """What setup_telemetry installed; shutdown() flushes and stops the exporters."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    exporters: list[str] = field(default_factory=list)

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def setup_telemetry(
    service_name: str,
    *,
    prometheus_port: int = 0,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
) -> Telemetry:
    """Installs tracer and meter providers for this process, as the environment asks.

    `span_exporter` / `metric_reader` add one more destination (tests pass in-memory ones).
    Returns an empty Telemetry, installing nothing, when no destination is configured.
    """
    env = os.environ
    resource = Resource.create(_resource_attributes(service_name))
    telemetry = Telemetry()
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    processors: list[Any] = []
    if endpoint:
        protocol = otlp_protocol("traces")
        OTLPSpanExporter, _ = _otlp_exporters(protocol)
        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
        telemetry.exporters.append(f"otlp({protocol}):{endpoint}")
    if env.get("OTEL_TRACES_EXPORTER", "") == "console":
        processors.append(SimpleSpanProcessor(ConsoleSpanExporter()))
        telemetry.exporters.append("console")
    trace_file = env.get("TIERMESH_TRACE_FILE")
    if trace_file:
        processors.append(
            BatchSpanProcessor(JsonLinesSpanExporter(trace_file), schedule_delay_millis=200)
        )
        telemetry.exporters.append(f"file:{trace_file}")
    if span_exporter is not None:
        processors.append(SimpleSpanProcessor(span_exporter))
    if processors:
        provider = TracerProvider(resource=resource, id_generator=ReservedIdGenerator())
        for processor in processors:
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        telemetry.tracer_provider = provider

    readers: list[MetricReader] = []
    if endpoint or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        _, OTLPMetricExporter = _otlp_exporters(otlp_protocol("metrics"))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if prometheus_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server

        host = metrics_host()
        start_http_server(prometheus_port, addr=host)
        readers.append(PrometheusMetricReader())
        telemetry.exporters.append(f"prometheus:{host}:{prometheus_port}/metrics")
    if metric_reader is not None:
        readers.append(metric_reader)
    if readers:
        meter_provider = MeterProvider(
            resource=resource, metric_readers=readers, views=histogram_views()
        )
        metrics.set_meter_provider(meter_provider)
        telemetry.meter_provider = meter_provider
    if telemetry.exporters:
        log.info("telemetry for %s: %s", service_name, ", ".join(telemetry.exporters))
    return telemetry
