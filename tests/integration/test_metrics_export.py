"""Metrics as a dashboard reads them: the Prometheus scrape of a real mesh after a few chats
carries the GenAI histograms with their convention bucket boundaries (not the SDK's defaults),
the Views spread samples over those buckets, and the OTLP/HTTP exporter and OTEL_SERVICE_NAME
are honoured. Each check runs in its own process: OpenTelemetry providers are set once per
process."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from services.common.metric_views import TIME_PER_OUTPUT_TOKEN, TIME_TO_FIRST_TOKEN

ROOT = Path(__file__).resolve().parents[2]


def _python(script: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_prometheus_scrape_after_chats_has_genai_buckets(tiny_model_dir: Path) -> None:
    port = _free_port()
    scrape = _python(
        f"""
        import asyncio, urllib.request
        from pathlib import Path
        from services.common.telemetry import setup_telemetry
        from tests.integration.mesh import start_mesh
        from tiermesh.client import AsyncRouterClient

        telemetry = setup_telemetry("tiermesh-test", prometheus_port={port})

        async def main():
            mesh = await start_mesh(Path({str(tiny_model_dir)!r}))
            try:
                async with AsyncRouterClient(mesh.address) as client:
                    for n in range(4):
                        await client.chat("What is your return policy?" * (1 + n),
                                          mode="pinned", tier="small", max_tokens=8)
                    await client.chat("Hi", mode="progressive", max_tokens=8)
            finally:
                await mesh.stop()

        asyncio.run(main())
        print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode())
        telemetry.shutdown()
        """
    )
    ttft = re.findall(
        r'^gen_ai_server_time_to_first_token_seconds_bucket\{.*le="([^"]+)".*\} (\S+)$',
        scrape,
        re.MULTILINE,
    )
    bounds = sorted({float(le) for le, _ in ttft if le != "+Inf"})
    assert bounds == list(TIME_TO_FIRST_TOKEN)
    counts = re.findall(
        r"^gen_ai_server_time_to_first_token_seconds_count\{.*\} (\S+)$", scrape, re.M
    )
    assert sum(float(c) for c in counts) == 6.0  # 4 pinned + a progressive draft and refinement
    tpot = re.findall(r'gen_ai_server_time_per_output_token_seconds_bucket\{.*le="([^"]+)"', scrape)
    assert sorted({float(le) for le in tpot if le != "+Inf"}) == list(TIME_PER_OUTPUT_TOKEN)

    exported = set(re.findall(r"^# TYPE (\S+) ", scrape, re.M))
    for expr in _dashboard_queries():
        series = re.sub(r"by \([^)]*\)|\{[^}]*\}", "", expr)  # label names are not metrics
        for name in re.findall(r"\b((?:tiermesh|gen_ai)_[a-z0-9_]+)", series):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in exported, f"dashboard query uses {name}, not exported: {expr}"


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((ROOT / "mesh" / "grafana" / "tiermesh-dashboard.json").read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(queries) >= 10
    return queries


def test_views_spread_samples_over_the_convention_buckets() -> None:
    out = _python(
        """
        import json
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from services.common.telemetry import setup_telemetry

        reader = InMemoryMetricReader()
        setup_telemetry("tiermesh-test", metric_reader=reader)
        meter = metrics.get_meter("t")
        ttft = meter.create_histogram("gen_ai.server.time_to_first_token", unit="s")
        for seconds in (0.0004, 0.003, 0.003, 0.03, 0.3, 3.0):
            ttft.record(seconds)
        point = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[0]
        point = point.data.data_points[0]
        print(json.dumps({"bounds": list(point.explicit_bounds),
                          "counts": list(point.bucket_counts)}))
        """
    )
    result = json.loads(out)
    assert result["bounds"] == list(TIME_TO_FIRST_TOKEN)
    occupied = [i for i, n in enumerate(result["counts"]) if n]
    assert len(occupied) == 5, result  # 0.4 ms, 3 ms (x2), 30 ms, 300 ms, 3 s: five buckets
    assert sum(result["counts"]) == 6


class _OtlpHttpReceiver(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_otlp_http_protobuf_and_service_name_from_the_environment() -> None:
    server = HTTPServer(("127.0.0.1", 0), _OtlpHttpReceiver)
    _OtlpHttpReceiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _python(
            """
            from opentelemetry import trace
            from services.common.telemetry import setup_telemetry

            telemetry = setup_telemetry("router")
            with trace.get_tracer("t").start_as_current_span("probe span"):
                pass
            telemetry.shutdown()
            """,
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_SERVICE_NAME": "checkout-router",
                "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=staging",
                "OTEL_METRICS_EXPORTER": "none",
            },
        )
    finally:
        server.shutdown()
        server.server_close()
    traces = [body for path, body in _OtlpHttpReceiver.received if path == "/v1/traces"]
    assert traces, _OtlpHttpReceiver.received
    request = ExportTraceServiceRequest.FromString(traces[0])
    resource = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "checkout-router"
    assert resource["service.namespace"] == "tiermesh"
    assert resource["deployment.environment"] == "staging"
    names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert names == ["probe span"]
