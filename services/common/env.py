"""Every environment variable tiermesh reads, in one place, typed and documented.

| variable | meaning | default |
| --- | --- | --- |
| TIERMESH_ROUTER | router address `tiermesh chat` and the SDK use | 127.0.0.1:50051 |
| TIERMESH_LOG_LEVEL | log level of every service (DEBUG, INFO, WARNING, ERROR) | INFO |
| TIERMESH_RUN_DIR | where `tiermesh run` writes logs, pids.json, mesh.json (for top) | .tiermesh |
| TIERMESH_TORCH_THREADS | torch intra-op threads per tier process (overrides the config) | unset |
| TIERMESH_LINEAR_LAYOUT | tiers' linear layers on CPU: `auto`, `packed`, `input-major` (*) | auto |
| TIERMESH_TRACE_FILE | JSON-lines span file of every service | `tiermesh run`: in run dir |
| TIERMESH_METRICS_HOST | address the Prometheus /metrics endpoints bind to | 127.0.0.1 |
| TIERMESH_TRUST_TRACE_CONTEXT | `1`: the router continues callers' trace context, baggage | no |
| OTEL_EXPORTER_OTLP_ENDPOINT | OTLP receiver for traces and metrics | unset: no OTLP |
| OTEL_EXPORTER_OTLP_PROTOCOL | `grpc` or `http/protobuf` (or per signal: _TRACES_, ...) | grpc |
| OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES | override the service name / add attributes | unset |
| OTEL_TRACES_EXPORTER | `console` prints spans to stderr | unset |
| GRPC_XDS_BOOTSTRAP(_CONFIG) | xDS bootstrap file (inline JSON) for xds:/// targets | unset |

(*) read by services/tier/linear_kernels.py itself: the engines import nothing that reaches gRPC.

The other standard `OTEL_*` settings (OTEL_BSP_SCHEDULE_DELAY, OTEL_METRIC_EXPORT_INTERVAL, ...)
apply as OpenTelemetry documents them; services/common/telemetry.py reads them through the SDK.
"""

from __future__ import annotations

import os

from tiermesh.client.router_client import DEFAULT_ROUTER_ADDRESS, router_address

__all__ = [
    "DEFAULT_ROUTER_ADDRESS",
    "log_level",
    "metrics_host",
    "router_address",
    "run_dir",
    "torch_threads",
]


def log_level() -> str:
    return os.environ.get("TIERMESH_LOG_LEVEL", "INFO").upper()


def run_dir() -> str:
    return os.environ.get("TIERMESH_RUN_DIR", ".tiermesh")


def torch_threads() -> int | None:
    value = os.environ.get("TIERMESH_TORCH_THREADS")
    return int(value) if value else None


def metrics_host() -> str:
    return os.environ.get("TIERMESH_METRICS_HOST", "127.0.0.1")
