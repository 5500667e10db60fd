"""Metrics as a dashboard reads them: the Prometheus scrape of a real mesh after a few chats
carries the GenAI histograms with their convention bucket boundaries (not the SDK's defaults),
samples spread over several buckets, the GenAI attributes on every GenAI series (error.type on
a failed chat, one model identity), the GenAI durations beside the tiermesh ones, and the span
names of the same chats; the Views spread samples over those buckets, and the OTLP/HTTP
exporter and OTEL_SERVICE_NAME are honoured. Each check runs in its own process: OpenTelemetry
providers are set once per process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from services.common.metric_views import (
    REQUEST_DURATION,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
)
from services.common.ports import free_port
from tests.integration.gateway_mesh import GatewayMesh

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


def test_prometheus_scrape_after_chats_has_genai_buckets(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    port = free_port()
    trace_file = tmp_path / "traces.jsonl"
    scrape = _python(
        f"""
        import asyncio, urllib.request
        from pathlib import Path
        from services.common.telemetry import setup_telemetry
        from tests.integration.mesh import start_mesh
        from tiermesh.client import AsyncRouterClient, ChatError

        telemetry = setup_telemetry("tiermesh-test", prometheus_port={port})

        async def main():
            # one request decodes at a time: the pinned chats sent together queue behind each
            # other, so their times to first token and durations differ by whole answers
            mesh = await start_mesh(Path({str(tiny_model_dir)!r}), tier_options={{
                "max_running": 1}})
            try:
                async with AsyncRouterClient(mesh.address) as client:
                    await asyncio.gather(*(
                        client.chat("What is your return policy?" * (1 + n),
                                    mode="pinned", tier="small", max_tokens=8 + 16 * n)
                        for n in range(4)))
                    await client.chat("Hi", mode="progressive", progressive_gate="always",
                                      max_tokens=8)
                    try:
                        await client.chat("Hi", mode="pinned", tier="small", max_tokens=100_000)
                    except ChatError as e:
                        assert e.code == "INVALID_ARGUMENT", e
            finally:
                await mesh.stop()

        asyncio.run(main())
        print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read().decode())
        telemetry.shutdown()
        """,
        env={"TIERMESH_TRACE_FILE": str(trace_file)},
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
    assert _occupied_buckets(scrape, "gen_ai_server_time_to_first_token_seconds") > 1
    tpot = re.findall(r'gen_ai_server_time_per_output_token_seconds_bucket\{.*le="([^"]+)"', scrape)
    assert sorted({float(le) for le in tpot if le != "+Inf"}) == list(TIME_PER_OUTPUT_TOKEN)

    _assert_genai_series(scrape, tiny_model_dir.name)
    _assert_span_names(trace_file)

    exported = set(re.findall(r"^# TYPE (\S+) ", scrape, re.M))
    for expr in _dashboard_queries():
        series = re.sub(r"by \([^)]*\)|\{[^}]*\}", "", expr)  # label names are not metrics
        for name in re.findall(r"\b((?:tiermesh|gen_ai)_[a-z0-9_]+)", series):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert base in exported, f"dashboard query uses {name}, not exported: {expr}"


def _series(scrape: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of `name` in a scrape: its labels and value."""
    samples = []
    for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", scrape, re.M):
        samples.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return samples


def _occupied_buckets(scrape: str, histogram: str) -> int:
    """How many buckets of `histogram` (summed over its series) hold at least one sample."""
    cumulative: dict[float, float] = {}
    for labels, value in _series(scrape, f"{histogram}_bucket"):
        le = float(labels["le"])
        cumulative[le] = cumulative.get(le, 0.0) + value
    counts = [cumulative[le] for le in sorted(cumulative)]
    return sum(1 for before, now in zip([0.0, *counts], counts, strict=False) if now > before)


def _assert_genai_series(scrape: str, model_name: str) -> None:
    """The GenAI attributes on every GenAI series (the exporter writes an attribute a series
    lacks as ""); the durations spread over several buckets; one model identity; error.type on
    the refused chat (refused before routing: no model was asked for yet)."""
    genai = sorted(set(re.findall(r"^(gen_ai_\w+?)_(?:bucket|sum|count)\{", scrape, re.M)))
    assert {
        "gen_ai_server_request_duration_seconds",
        "gen_ai_client_operation_duration_seconds",
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "gen_ai_client_token_usage",
    } <= set(genai), genai
    for histogram in genai:
        for labels, _ in _series(scrape, f"{histogram}_count"):
            assert labels["gen_ai_operation_name"] == "chat", (histogram, labels)
            assert labels["gen_ai_provider_name"] == "tiermesh", (histogram, labels)
            if labels.get("error_type"):
                continue
            assert labels["gen_ai_request_model"] in ("small", "medium", "large"), labels
            model = f"{labels['gen_ai_request_model']}/{model_name}"
            assert labels["gen_ai_response_model"] == model, (histogram, labels)
    for histogram in ("gen_ai_server_request_duration_seconds",):
        assert _occupied_buckets(scrape, histogram) > 1, histogram
    calls = _series(scrape, "gen_ai_client_operation_duration_seconds_count")
    assert sum(value for _, value in calls) >= 6.0  # the router's calls to the tiers
    refused = [
        labels
        for labels, _ in _series(scrape, "gen_ai_server_request_duration_seconds_count")
        if labels.get("error_type") == "INVALID_ARGUMENT"
    ]
    assert len(refused) == 1, refused


def _assert_span_names(trace_file: Path) -> None:
    """The same chats' spans: the GenAI ones named `chat <model>` by the router and the tiers."""
    spans = [json.loads(line) for line in trace_file.read_text().splitlines() if line]
    names = {span["name"] for span in spans}
    assert {"chat small", "chat large", "router Chat"} <= names, names
    for span in spans:
        if span["name"].startswith("chat "):
            attributes = span["attributes"]
            assert span["name"] == f"chat {attributes['gen_ai.request.model']}", span
            assert attributes["rpc.method"] == "tiermesh.v1.TierService/Generate", span


def test_gateway_metrics_have_its_router_calls_with_the_genai_attributes(
    tiny_model_dir: Path,
) -> None:
    gateway = GatewayMesh.start(tiny_model_dir)
    try:
        for stream in (False, True):
            body = {"model": "tiermesh-small", "messages": [{"role": "user", "content": "Hi"}]}
            response = httpx.post(
                f"{gateway.url}/v1/chat/completions",
                json={**body, "max_tokens": 4, "stream": stream},
                timeout=60,
            )
            assert response.status_code == 200, response.text
        scrape = httpx.get(f"{gateway.url}/metrics").text
    finally:
        gateway.stop()
    calls = _series(scrape, "gen_ai_client_operation_duration_seconds_count")
    assert [labels for labels, _ in calls] == [
        {
            "gen_ai_operation_name": "chat",
            "gen_ai_provider_name": "tiermesh",
            "gen_ai_request_model": "tiermesh-small",  # what the gateway's client asked for
            "gen_ai_response_model": f"small/{tiny_model_dir.name}",
            "error_type": "",
        }
    ]
    assert calls[0][1] == 2.0
    buckets = _series(scrape, "gen_ai_client_operation_duration_seconds_bucket")
    assert sorted({float(labels["le"]) for labels, _ in buckets if labels["le"] != "+Inf"}) == list(
        REQUEST_DURATION
    )


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


def test_router_reports_each_tier_serving_as_a_gauge(tiny_model_dir: Path) -> None:
    """`tiermesh.router.tier.serving`: 1 for a tier that serves, 0 for one whose port is closed,
    as the Prometheus scrape of a real router shows it."""
    port = free_port()
    scrape = _python(
        f"""
        import asyncio, urllib.request
        from pathlib import Path
        from services.common.telemetry import setup_telemetry
        from tests.integration.mesh import start_mesh

        telemetry = setup_telemetry("tiermesh-test", prometheus_port={port})

        async def main():
            mesh = await start_mesh(Path({str(tiny_model_dir)!r}), tiers=("small",),
                                    down=("medium",), router_options={{"refine_tier": "medium"}})
            try:
                for _ in range(200):  # until the router has published both tiers
                    text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics").read()
                    if text.count(b"tiermesh_router_tier_serving{{") == 2:
                        return text.decode()
                    await asyncio.sleep(0.05)
                return text.decode()
            finally:
                await mesh.stop()

        print(asyncio.run(main()))
        telemetry.shutdown()
        """
    )
    serving = {
        labels["tiermesh_tier"]: value
        for labels, value in _series(scrape, "tiermesh_router_tier_serving")
    }
    assert serving == {"small": 1.0, "medium": 0.0}, scrape[-2000:]
