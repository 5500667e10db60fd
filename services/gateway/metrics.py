"""The gateway's Prometheus metrics (served at GET /metrics) in a registry of its own, with
gen_ai.client.operation.duration (its calls to the router) named and labelled as the
OpenTelemetry Prometheus exporter names the services' own (`gen_ai_request_model`, ...) and
bucketed like them.

Knows nothing of requests beyond the labels it is given.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.common.metric_views import REQUEST_DURATION

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
# the GenAI attributes of gen_ai.client.operation.duration, as Prometheus label names
OPERATION_ATTRIBUTES = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "error.type",
)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tiermesh_gateway_requests",
            "Chat completion requests by model, streaming and HTTP status",
            ["model", "stream", "status"],
            registry=self.registry,
        )
        self.time_to_first_content = Histogram(
            "tiermesh_gateway_time_to_first_content_seconds",
            "From request to the first answer text sent to the client",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.duration = Histogram(
            "tiermesh_gateway_request_duration_seconds",
            "From request to the end of the response",
            ["model", "stream"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.active_streams = Gauge(
            "tiermesh_gateway_active_streams",
            "Streamed responses in progress",
            registry=self.registry,
        )
        self.operation_duration = Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Calls to the router, from the call to its end (last event, failure or cancel)",
            [name.replace(".", "_") for name in OPERATION_ATTRIBUTES],
            buckets=REQUEST_DURATION,
            registry=self.registry,
        )
        self.completion_tokens = Counter(
            "tiermesh_gateway_completion_tokens",
            "Completion tokens of the answers returned",
            ["model"],
            registry=self.registry,
        )

    def record_operation(self, seconds: float, attributes: dict[str, str]) -> None:
        """One call to the router: `attributes` are its GenAI attributes (absent ones empty)."""
        labels = [attributes.get(name, "") for name in OPERATION_ATTRIBUTES]
        self.operation_duration.labels(*labels).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
