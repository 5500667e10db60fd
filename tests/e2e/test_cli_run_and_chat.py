"""End to end through the console script: `tiermesh run` in a child process (exporting spans to
a real OTLP/gRPC receiver in this test), then `tiermesh chat --json` against it, `tiermesh trace`
on its span file, then SIGTERM stops every service."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.common.tiers import TIER_NAMES
from services.launcher.local_mesh import free_base_port
from tests.e2e.run_process import ROOT, TIERMESH, chat_json, tiermesh_run
from tests.tiny_model import build_tiny_model


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
    base = free_base_port()
    env = {
        "TIERMESH_RUN_DIR": str(tmp_path / "run"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver[1],
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
    }
    models = [f"small={tiny_model_dir}", f"medium={tiny_model_dir}", f"large={other}"]
    args = ["--base-port", str(base), *(a for m in models for a in ("--model", m))]
    args += ["--progressive-gate", "always"]  # the router refines every draft
    with tiermesh_run(args, env) as (process, output):
        yield process, f"127.0.0.1:{base}", output, otlp_receiver[0], tmp_path / "run"


def test_run_then_chat_json_then_sigterm(mesh_process) -> None:
    process, router, output, receiver, run_dir = mesh_process
    assert "tiermesh is up" in "".join(output)
    args = ["--mode", "progressive", "--max-tokens", "16", "What is your return policy?"]
    events = chat_json(router, *args)
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
    assert events[-1]["model"].startswith("large/")  # the answering model, <tier>/<model>

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

    # --stop: the answer ends just before the stop sequence (taken from the whole answer)
    pinned = ["--mode", "pinned", "--tier", "small", "--max-tokens", "16", "Any returns?"]
    whole = chat_json(router, *pinned)[-1]["text"]
    assert len(whole) >= 4, whole
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    cut = chat_json(router, *pinned, "--stop", stop, "--stop", "\x01")
    assert cut[-1]["text"] == whole[: whole.find(stop)], (whole, stop)
    assert [e["finish_reason"] for e in cut if e["type"] == "revision_end"] == ["stop"]

    # --top-logprobs: the delta lines list their tokens, whose texts make the answer
    listed = chat_json(router, *pinned, "--top-logprobs", "2")
    deltas = [e for e in listed if e["type"] == "delta"]
    tokens = [t for d in deltas for t in d["token_logprobs"]]
    assert "".join(t["text"] for t in tokens) == listed[-1]["text"] == whole
    assert all(len(t["top"]) == 2 and t["logprob"] <= 0 for t in tokens)

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

    # tiermesh top finds this mesh's tiers (not the configs' default ports) from its run dir
    top = subprocess.run(
        [*TIERMESH, "top", "--once", "--json"],
        cwd=ROOT,
        env={**os.environ, "TIERMESH_RUN_DIR": str(run_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert top.returncode == 0, top.stderr
    snapshot = json.loads(top.stdout)
    base = int(router.rpartition(":")[2])
    assert snapshot["router"] == {"address": router, "serving": True}
    assert [(row["tier"], row["address"], row["serving"]) for row in snapshot["tiers"]] == [
        (tier, f"127.0.0.1:{base + 10 + i}", True) for i, tier in enumerate(TIER_NAMES)
    ]

    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0, rest
    assert "stopping every service" in rest
    assert not (run_dir / "mesh.json").exists()
