"""End to end through the console script: `tiermesh run` in a child process (exporting spans to
a real OTLP/gRPC receiver in this test), then `tiermesh chat --json` against it, `tiermesh trace`
on its span file, then SIGTERM stops every service."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.tiny_model import build_tiny_model

TIERMESH = [sys.executable, "-m", "services.router.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _free_base_port() -> int:
    """A base port B with B and B+10..12 free (the layout `tiermesh run --base-port` uses)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + 12 > 65535:
            continue
        try:
            for port in (base + 10, base + 11, base + 12):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port layout found")


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """A minimal OTLP/gRPC trace receiver: keeps (service, trace id, span name) triples."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str]] = []

    def Export(self, request, context):
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    service = attributes.get("service.name", "")
                    self.spans.append((service, span.trace_id.hex(), span.name))
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def otlp_receiver():
    from concurrent.futures import ThreadPoolExecutor

    receiver = OtlpReceiver()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, f"http://127.0.0.1:{port}"
    server.stop(0)


@pytest.fixture
def mesh_process(tiny_model_dir: Path, tmp_path: Path, otlp_receiver):
    other = build_tiny_model(tmp_path / "large-model", seed=7)
    base = _free_base_port()
    env = {
        **os.environ,
        "TIERMESH_RUN_DIR": str(tmp_path / "run"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver[1],
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    command = [
        *TIERMESH,
        "run",
        "--no-demo",
        "--base-port",
        str(base),
        "--model",
        f"small={tiny_model_dir}",
        "--model",
        f"medium={tiny_model_dir}",
        "--model",
        f"large={other}",
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output: list[str] = []
    deadline = time.monotonic() + 120
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if "serving; Ctrl-C" in line:
            break
    else:
        process.kill()
    assert process.poll() is None, "".join(output)
    yield process, f"127.0.0.1:{base}", output, otlp_receiver[0], tmp_path / "run"
    if process.poll() is None:  # the test failed midway: stop the mesh the normal way first
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_run_then_chat_json_then_sigterm(mesh_process) -> None:
    process, router, output, receiver, run_dir = mesh_process
    assert "tiermesh is up" in "".join(output)
    args = ["--mode", "progressive", "--json", "--max-tokens", "16", "What is your return policy?"]
    chat = subprocess.run(
        [*TIERMESH, "chat", "--router", router, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert chat.returncode == 0, chat.stderr
    events = [json.loads(line) for line in chat.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "route" and types[-1] == "final"
    starts = [e for e in events if e["type"] == "revision_start"]
    assert [(s["revision"], s["tier"], s["replaces"]) for s in starts] == [
        (0, "small", None),
        (1, "large", 0),
    ]
    assert all(isinstance(e["t_ms"], float | int) for e in events)
    assert [e["t_ms"] for e in events] == sorted(e["t_ms"] for e in events)
    revision1 = "".join(e["text"] for e in events if e["type"] == "delta" and e["revision"] == 1)
    assert events[-1]["revision"] == 1 and events[-1]["text"] == revision1

    # The chat's spans reach the OTLP receiver from the router and both tiers, in one trace.
    request_id = events[0]["request_id"]
    trace_cmd = [*TIERMESH, "trace", "--json", "--file", str(run_dir / "traces.jsonl")]
    trace_cmd += ["--request-id", request_id]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        routers = [s for s in receiver.spans if s[0] == "router" and s[2] == "router Chat"]
        if routers:
            trace_id = routers[-1][1]
            services = {s[0] for s in receiver.spans if s[1] == trace_id}
            if {"router", "tier-small", "tier-large"} <= services:
                break
        time.sleep(0.2)
    else:
        raise AssertionError(f"spans not exported: {receiver.spans}")
    shown = subprocess.run(trace_cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    local = json.loads(shown.stdout)
    assert {s["trace_id"] for s in local} == {trace_id}
    assert {"router", "tier-small", "tier-large"} <= {s["service"] for s in local}
    assert {"route", "revision 0", "revision 1", "engine decode"} <= {s["name"] for s in local}

    bad = subprocess.run(
        [*TIERMESH, "chat", "--router", router, "--json", "--max-tokens", "0", "hi"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    error = json.loads(bad.stdout.splitlines()[-1])
    assert error["type"] == "error" and error["code"] == "INVALID_ARGUMENT"
    assert error["message"].startswith("max_tokens:")

    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, rest
    assert "stopping every service" in rest
