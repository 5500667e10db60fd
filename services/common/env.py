"""Every environment variable tiermesh reads, in one place, typed and documented: `VARIABLES`
(name -> type and default, a comment on each), and accessors for those every service reads.
Knows variable names and their parsing; nothing of what a service does with the values.
tests/unit/test_env_registry.py scans the code for reads by name and fails when one is missing
here, or when one listed here is read nowhere.

Most variables are read where they are used (the module named in the comment): the tier's
engines import nothing that reaches gRPC, and the client SDK nothing of the servers. The other
standard `OTEL_*` settings (OTEL_BSP_SCHEDULE_DELAY, OTEL_METRIC_EXPORT_INTERVAL, ...) apply as
OpenTelemetry documents them: services/common/telemetry.py leaves them to the SDK, as grpcio
reads GRPC_XDS_BOOTSTRAP(_CONFIG) itself for xds:/// targets.

A variable whose name a config file gives is the operator's to name, so it is not listed here:
a remote tier's API key is read from the variable its `remote_api_key_env` names
(services.tier.remote_server, in the environment mapping services.tier.factory gives the
openai engine).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tiermesh.client.router_client import DEFAULT_ROUTER_ADDRESS, router_address

__all__ = [
    "DEFAULT_ROUTER_ADDRESS",
    "VARIABLES",
    "Variable",
    "log_level",
    "metrics_host",
    "router_address",
    "run_dir",
    "torch_threads",
]


@dataclass(frozen=True)
class Variable:
    type: type  # what the value is read as; bool: "1" is on, anything else (or unset) off
    default: str  # what applies while it is unset ("unset": that feature is off)


# name -> type and default; the comment says what it means and, where it is not read through
# this module, which module reads it
VARIABLES: dict[str, Variable] = {
    # router address `tiermesh chat` and the SDK use (tiermesh.client.router_client)
    "TIERMESH_ROUTER": Variable(str, DEFAULT_ROUTER_ADDRESS),
    # API key (Bearer) the SDK, `tiermesh tier`, `tiermesh top` and `tiermesh mesh status` send
    "TIERMESH_API_KEY": Variable(str, "unset"),
    # log level of every service: DEBUG, INFO, WARNING, ERROR
    "TIERMESH_LOG_LEVEL": Variable(str, "INFO"),
    # where `tiermesh run` writes logs, pids.json, mesh.json (for top), keys and certificates
    "TIERMESH_RUN_DIR": Variable(Path, ".tiermesh"),
    # JSON-lines span file every service appends to, `tiermesh trace` reads (telemetry,
    # services.cli.trace_view); `tiermesh run` sets <run dir>/traces.jsonl for its children
    "TIERMESH_TRACE_FILE": Variable(Path, "unset"),
    # address the Prometheus /metrics endpoints bind to
    "TIERMESH_METRICS_HOST": Variable(str, "127.0.0.1"),
    # the router continues callers' trace context and baggage (services.common.telemetry)
    "TIERMESH_TRUST_TRACE_CONTEXT": Variable(bool, "off"),
    # pid of the launcher or harness a service stops with (services.common.parent_watch)
    "TIERMESH_STOP_WITH_PARENT": Variable(int, "unset"),
    # torch intra-op threads per tier process, over the tier config's
    "TIERMESH_TORCH_THREADS": Variable(int, "the config's"),
    # tiers' linear layers on CPU: auto, packed, input-major (services.tier.linear_kernels)
    "TIERMESH_LINEAR_LAYOUT": Variable(str, "auto"),
    # security, read by services.security.settings: the CA that signs peers (turns TLS on, with
    # this service's certificate and key, PEM files)
    "TIERMESH_TLS_CA": Variable(Path, "unset: plaintext"),
    "TIERMESH_TLS_CERT": Variable(Path, "unset"),
    "TIERMESH_TLS_KEY": Variable(Path, "unset"),
    # client certificates: `require` (mTLS) or `optional`
    "TIERMESH_TLS_CLIENT_AUTH": Variable(str, "require"),
    # comma list of SPIFFE IDs allowed to call (tiers: the router's)
    "TIERMESH_ALLOWED_CALLERS": Variable(str, "anyone"),
    # API key file the router enforces and `tiermesh keys` edits (also services.security.cli,
    # where it defaults to <run dir>/keys.json)
    "TIERMESH_KEYS_FILE": Variable(Path, "unset: no keys"),
    # allow plaintext beyond loopback
    "TIERMESH_INSECURE": Variable(bool, "off"),
    # gRPC server reflection: `1` on, `0` off
    "TIERMESH_REFLECTION": Variable(bool, "on without TLS, off with"),
    # every gRPC server's connection limits (services.common.grpc_service.ServerLimits):
    # connections open at once (kept under the open files limit), seconds from accept to the
    # client's HTTP/2 SETTINGS, concurrent calls per connection, seconds a connection with no
    # call is kept (0: forever)
    "TIERMESH_GRPC_MAX_CONNECTIONS": Variable(int, "4096"),
    "TIERMESH_GRPC_HANDSHAKE_TIMEOUT_S": Variable(float, "5"),
    "TIERMESH_GRPC_MAX_STREAMS": Variable(int, "4096"),
    "TIERMESH_GRPC_IDLE_TIMEOUT_S": Variable(float, "300"),
    # OpenTelemetry, as its specification names them (services.common.telemetry): the OTLP
    # receiver of traces and metrics, or of one signal
    "OTEL_EXPORTER_OTLP_ENDPOINT": Variable(str, "unset: no OTLP"),
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": Variable(str, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": Variable(str, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    # OTLP over `grpc` or `http/protobuf`, for both signals or for one
    "OTEL_EXPORTER_OTLP_PROTOCOL": Variable(str, "grpc"),
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": Variable(str, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": Variable(str, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    # the service name, over the service's own (tiermesh-router, ...)
    "OTEL_SERVICE_NAME": Variable(str, "unset"),
    # key=value,... on every span and metric (a service.name there names the service)
    "OTEL_RESOURCE_ATTRIBUTES": Variable(str, "unset"),
    # `console` prints spans to stderr
    "OTEL_TRACES_EXPORTER": Variable(str, "unset"),
    # xDS bootstrap for xds:/// targets, a file or inline JSON (grpcio reads both; mesh.bootstrap
    # writes the JSON for the router, `tiermesh mesh probe` when neither is set)
    "GRPC_XDS_BOOTSTRAP": Variable(Path, "unset"),
    "GRPC_XDS_BOOTSTRAP_CONFIG": Variable(str, "unset"),
    # `tiermesh train` sets these and runs itself again in a fresh interpreter unless they are
    # already so (services.training.cli): malloc reads its settings only at process start, and
    # keeps big tensor buffers mapped (4 GiB) and freed memory for reuse (64 GiB) with them; the
    # tokenizer's own thread pool would fight torch's for the cores unless `false`
    # a vLLM tier (services.launcher.vllm_tiers): the interpreter of the environment holding
    # vLLM when the tier config names none; and what vLLM reads at start, which the tier sets
    # from its config unless the environment has them (services.tier.vllm_args): GiB of memory
    # for the KV cache on CPU, and the threads of each CPU worker
    "TIERMESH_VLLM_PYTHON": Variable(Path, ".venv-vllm/bin/python in the checkout"),
    "VLLM_CPU_KVCACHE_SPACE": Variable(float, "the tier's cpu_kvcache_space_gib"),
    "OMP_NUM_THREADS": Variable(int, "the tier's torch_threads"),
    "MALLOC_MMAP_THRESHOLD_": Variable(int, "glibc's"),
    "MALLOC_TRIM_THRESHOLD_": Variable(int, "glibc's"),
    "TOKENIZERS_PARALLELISM": Variable(str, "true"),
}


def log_level() -> str:
    return os.environ.get("TIERMESH_LOG_LEVEL", "INFO").upper()


def run_dir() -> str:
    return os.environ.get("TIERMESH_RUN_DIR", ".tiermesh")


def torch_threads() -> int | None:
    value = os.environ.get("TIERMESH_TORCH_THREADS")
    return int(value) if value else None


def metrics_host() -> str:
    return os.environ.get("TIERMESH_METRICS_HOST", "127.0.0.1")
