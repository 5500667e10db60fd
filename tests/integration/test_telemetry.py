"""OpenTelemetry across SDK -> router -> tier -> engine, with in-memory exporters and real
servers on port 0: one trace, correct parents, GenAI span names and attributes (one model
identity from tier to router), current RPC attribute keys, cancelled spans, metrics with the
GenAI attributes (error.type on failures) and the GenAI durations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from rich.console import Console
from tiermesh.client import AsyncRouterClient, ChatError

from services.cli.trace_view import build_tree
from services.common.telemetry import TRUST_TRACE_CONTEXT_ENV, setup_telemetry, span_record
from tests.integration.mesh import Mesh, leave_after_first_delta, start_mesh

PROMPT = "What is your return policy?"


@pytest.fixture(scope="session")
def captured() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """Process-wide providers (OpenTelemetry allows setting them once per process)."""
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    setup_telemetry("tiermesh-test", span_exporter=spans, metric_reader=metrics)
    return spans, metrics


@pytest.fixture
def spans(captured: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> Iterator[Any]:
    exporter = captured[0]
    exporter.clear()
    yield exporter
    exporter.clear()


@pytest.fixture
async def mesh(
    tiny_model_dir: Path, spans: Any, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Mesh]:
    """A mesh whose router trusts its callers' trace context (the SDK's span is its parent)."""
    monkeypatch.setenv(TRUST_TRACE_CONTEXT_ENV, "1")
    mesh = await start_mesh(
        tiny_model_dir, tier_options={"max_tokens": 400}, router_options={"max_tokens": 400}
    )
    yield mesh
    await mesh.stop()


def by_name(finished: tuple[ReadableSpan, ...], name: str, kind: SpanKind) -> ReadableSpan:
    matches = [s for s in finished if s.name == name and s.kind == kind]
    assert len(matches) == 1, [(s.name, s.kind) for s in finished]
    return matches[0]


async def test_one_trace_from_sdk_to_engine(
    mesh: Mesh, spans: InMemorySpanExporter, tiny_model_dir: Path
) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        result = await client.chat(
            PROMPT, mode="progressive", progressive_gate="always", max_tokens=12
        )
    await asyncio.sleep(0.1)  # the tiers end their spans after the last message is sent
    finished = spans.get_finished_spans()
    assert len({s.context.trace_id for s in finished}) == 1
    sdk = by_name(finished, "chat", SpanKind.CLIENT)
    chat = by_name(finished, "router Chat", SpanKind.SERVER)
    assert sdk.parent is None
    assert chat.parent is not None and chat.parent.span_id == sdk.context.span_id
    route = by_name(finished, "route", SpanKind.INTERNAL)
    assert route.parent is not None and route.parent.span_id == chat.context.span_id
    # no span starts before its parent (one clock: the whole mesh runs in this process)
    started = {s.context.span_id: s.start_time or 0 for s in finished}
    early = [
        s.name
        for s in finished
        if s.parent is not None and (s.start_time or 0) < started[s.parent.span_id]
    ]
    assert early == []
    for tier, revision in (("small", 0), ("large", 1)):
        # GenAI span names: {gen_ai.operation.name} {gen_ai.request.model}
        client_span = by_name(finished, f"chat {tier}", SpanKind.CLIENT)
        server_span = by_name(finished, f"chat {tier}", SpanKind.SERVER)
        assert client_span.parent is not None
        assert client_span.parent.span_id == chat.context.span_id
        assert server_span.parent is not None
        assert server_span.parent.span_id == client_span.context.span_id
        phases = {
            s.name for s in finished if s.parent and s.parent.span_id == server_span.context.span_id
        }
        assert phases == {"engine queue", "engine prefill", "engine decode"}
        # one model identity: asked for by tier name, answered as <tier>/<model>, on both sides
        model = f"{tier}/{tiny_model_dir.name}"
        for span in (client_span, server_span):
            attributes = span.attributes or {}
            assert attributes["gen_ai.operation.name"] == "chat"
            assert attributes["gen_ai.provider.name"] == "tiermesh"
            assert attributes["gen_ai.request.model"] == tier
            assert attributes["gen_ai.response.model"] == model
            assert attributes["rpc.system.name"] == "grpc"
            assert attributes["rpc.method"] == "tiermesh.v1.TierService/Generate"
            assert attributes["rpc.response.status_code"] == "OK"
            assert "error.type" not in attributes
            for deprecated in ("rpc.system", "rpc.service", "rpc.grpc.status_code"):
                assert deprecated not in attributes
        assert (client_span.attributes or {})["server.address"] == "127.0.0.1"
        attributes = server_span.attributes or {}
        assert attributes["gen_ai.request.max_tokens"] == 12
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert tuple(attributes["gen_ai.response.finish_reasons"]) in (("stop",), ("length",))
        assert attributes["tiermesh.tier"] == tier
        revision_span = by_name(finished, f"revision {revision}", SpanKind.INTERNAL)
        assert (revision_span.attributes or {})["tiermesh.tier"] == tier
        assert server_span.status.status_code == StatusCode.OK
    chat_attributes = chat.attributes or {}
    assert chat_attributes["rpc.method"] == "tiermesh.v1.RouterService/Chat"
    assert chat_attributes["gen_ai.request.model"] == "large"
    assert chat_attributes["gen_ai.response.model"] == f"large/{tiny_model_dir.name}"
    assert chat_attributes["tiermesh.mode"] == "progressive"
    assert chat_attributes["tiermesh.policy"] == "progressive"
    assert chat_attributes["tiermesh.final.revision"] == result.revision


async def test_cancelled_stream_spans_end_promptly_as_cancelled(
    mesh: Mesh, spans: InMemorySpanExporter
) -> None:
    async with AsyncRouterClient(mesh.address) as client:
        await leave_after_first_delta(
            client, PROMPT, mode="progressive", progressive_gate="always", max_tokens=400
        )
    wanted = {("router Chat", SpanKind.SERVER), ("chat small", SpanKind.SERVER)}
    for _ in range(100):  # at most 2 s
        done = {(s.name, s.kind) for s in spans.get_finished_spans()}
        if wanted <= done:
            break
        await asyncio.sleep(0.02)
    finished = spans.get_finished_spans()
    for name, kind in sorted(wanted):
        span = by_name(finished, name, kind)
        assert span.status.status_code == StatusCode.ERROR
        assert (span.attributes or {})["rpc.response.status_code"] == "CANCELLED"
        assert (span.attributes or {})["error.type"] == "CANCELLED"
    sdk = by_name(finished, "chat", SpanKind.CLIENT)
    assert (sdk.attributes or {})["rpc.response.status_code"] == "CANCELLED"


async def test_the_router_starts_a_new_trace_for_an_untrusted_caller(
    tiny_model_dir: Path, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TIERMESH_TRUST_TRACE_CONTEXT the caller's trace context and baggage stop at the
    router: its Chat span is a new root that links to the caller's span, and the trace goes on
    inside the mesh (router -> tier) as before."""
    monkeypatch.delenv(TRUST_TRACE_CONTEXT_ENV, raising=False)
    options = {"draft_tier": "small", "refine_tier": "small"}
    mesh = await start_mesh(tiny_model_dir, tiers=("small",), router_options=options)
    try:
        token = otel_context.attach(baggage.set_baggage("tenant", "someone-else"))
        try:
            async with AsyncRouterClient(mesh.address) as client:
                await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=4)
        finally:
            otel_context.detach(token)
        await asyncio.sleep(0.1)  # the tier ends its spans after the last message is sent
    finally:
        await mesh.stop()
    finished = spans.get_finished_spans()
    sdk = by_name(finished, "chat", SpanKind.CLIENT)
    chat = by_name(finished, "router Chat", SpanKind.SERVER)
    assert chat.parent is None and chat.context.trace_id != sdk.context.trace_id
    assert [link.context.span_id for link in chat.links] == [sdk.context.span_id]
    assert [link.context.trace_id for link in chat.links] == [sdk.context.trace_id]
    client_span = by_name(finished, "chat small", SpanKind.CLIENT)
    server_span = by_name(finished, "chat small", SpanKind.SERVER)
    assert client_span.parent is not None and client_span.parent.span_id == chat.context.span_id
    assert server_span.parent is not None
    assert server_span.parent.span_id == client_span.context.span_id
    assert server_span.context.trace_id == chat.context.trace_id

    # the trace file keeps the link, and `tiermesh trace` shows where the chat came from
    records = [span_record(s) for s in finished]
    chat_record = next(r for r in records if r["span_id"] == format(chat.context.span_id, "016x"))
    sdk_trace, sdk_span = format(sdk.context.trace_id, "032x"), format(sdk.context.span_id, "016x")
    assert chat_record["links"] == [{"trace_id": sdk_trace, "span_id": sdk_span}]
    tree = build_tree([r for r in records if r["trace_id"] == chat_record["trace_id"]], records)
    console = Console(record=True, width=400)
    console.print(tree)
    assert f"linked from chat tiermesh-test (trace {sdk_trace})" in console.export_text()
    # one tree from the caller down: the SDK's span, the router's chat under it, the tier below
    assert str(tree.label) == f"trace {sdk_trace}, linked trace {chat_record['trace_id']}"
    [caller] = tree.children
    assert str(caller.label).startswith("[bold]chat[/bold] [dim]")
    [router_chat] = caller.children
    assert str(router_chat.label).startswith("[bold]router Chat[/bold]")
    tier_calls = [str(c.label) for c in router_chat.children]
    assert any(label.startswith("[bold]chat small[/bold]") for label in tier_calls), tier_calls


def _metric_points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    points: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


async def test_metrics_recorded_for_a_progressive_chat(
    mesh: Mesh, captured: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    reader = captured[1]
    reader.get_metrics_data()  # start from a clean slate of cumulative values
    async with AsyncRouterClient(mesh.address) as client:
        await client.chat(PROMPT, mode="progressive", progressive_gate="always", max_tokens=8)
    await asyncio.sleep(0.1)
    points = _metric_points(reader)
    for name in (
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.client.token.usage",
        "tiermesh.chat.time_to_first_draft",
        "tiermesh.chat.time_to_final",
        "tiermesh.chat.revisions",
        "tiermesh.chat.refinements",
        "tiermesh.route.decisions",
        "tiermesh.tier.queue_depth",
        "tiermesh.tier.kv_pool.used",
    ):
        assert points.get(name), f"{name} not recorded; have {sorted(points)}"
    outcomes = {dict(p.attributes)["tiermesh.outcome"] for p in points["tiermesh.chat.refinements"]}
    assert "completed" in outcomes
    decisions = {
        (dict(p.attributes)["tiermesh.mode"], dict(p.attributes)["tiermesh.tier"])
        for p in points["tiermesh.route.decisions"]
    }
    assert ("progressive", "large") in decisions


GENAI_METRICS = (
    "gen_ai.server.request.duration",
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
    "gen_ai.client.operation.duration",
    "gen_ai.client.token.usage",
)


async def test_genai_metrics_carry_the_required_attributes_and_one_model_identity(
    mesh: Mesh, captured: tuple[InMemorySpanExporter, InMemoryMetricReader], tiny_model_dir: Path
) -> None:
    reader = captured[1]
    async with AsyncRouterClient(mesh.address) as client:
        await client.chat(PROMPT, mode="progressive", progressive_gate="always", max_tokens=8)
    await asyncio.sleep(0.1)
    points = _metric_points(reader)
    for name in GENAI_METRICS:
        assert points.get(name), f"{name} not recorded; have {sorted(points)}"
        for point in points[name]:
            attributes = dict(point.attributes)
            assert attributes["gen_ai.operation.name"] == "chat", (name, attributes)
            assert attributes["gen_ai.provider.name"] == "tiermesh", (name, attributes)
            assert attributes["gen_ai.request.model"] in ("small", "medium", "large"), name
    ok = [dict(p.attributes) for name in GENAI_METRICS for p in points[name]]
    ok = [a for a in ok if "error.type" not in a]
    for attributes in ok:  # a model answered: the same identity wherever it is reported
        model = attributes["gen_ai.response.model"]
        assert model == f"{attributes['gen_ai.request.model']}/{tiny_model_dir.name}", attributes
    durations = [dict(p.attributes) for p in points["gen_ai.server.request.duration"]]
    tiers = {a["gen_ai.request.model"] for a in durations if "tiermesh.tier" in a}
    assert {"small", "large"} <= tiers  # the tiers' own
    router = [a for a in durations if a.get("tiermesh.mode") == "progressive"]
    assert router and router[0]["gen_ai.response.model"] == f"large/{tiny_model_dir.name}"
    calls = {
        dict(p.attributes)["gen_ai.request.model"]
        for p in points["gen_ai.client.operation.duration"]
    }
    assert {"small", "large"} <= calls  # the router's calls to the tiers


async def test_failed_requests_carry_error_type(
    mesh: Mesh, captured: tuple[InMemorySpanExporter, InMemoryMetricReader]
) -> None:
    reader = captured[1]
    async with AsyncRouterClient(mesh.address) as client:
        with pytest.raises(ChatError) as refused:
            await client.chat(PROMPT, mode="pinned", tier="small", max_tokens=100_000)
        assert refused.value.code == "INVALID_ARGUMENT"
        await leave_after_first_delta(client, PROMPT, mode="pinned", tier="small", max_tokens=400)
    errors: set[tuple[str, str, str]] = set()
    for _ in range(100):  # at most 2 s: the tier ends its span and metrics after the cancel
        points = _metric_points(reader)
        errors = {
            (name, dict(p.attributes)["error.type"], dict(p.attributes).get("tiermesh.tier", ""))
            for name in ("gen_ai.server.request.duration", "gen_ai.client.operation.duration")
            for p in points.get(name, [])
            if "error.type" in dict(p.attributes)
        }
        if ("gen_ai.server.request.duration", "CANCELLED", "small") in errors:
            break
        await asyncio.sleep(0.02)
    assert ("gen_ai.server.request.duration", "INVALID_ARGUMENT", "") in errors  # the router
    assert ("gen_ai.server.request.duration", "CANCELLED", "") in errors  # the router
    assert ("gen_ai.server.request.duration", "CANCELLED", "small") in errors  # the tier
    assert ("gen_ai.client.operation.duration", "CANCELLED", "small") in errors  # router -> tier


async def test_the_route_span_carries_what_the_policy_read(
    tiny_model_dir: Path, spans: InMemorySpanExporter
) -> None:
    mesh = await start_mesh(
        tiny_model_dir, router_options={"policy": "cost_target", "load_watch_interval_ms": 50}
    )
    try:
        async with AsyncRouterClient(mesh.address) as client:
            for _ in range(100):  # the first load reports, so the router has loads to read
                if all(mesh.router.watcher.loads[t] is not None for t in ("small", "large")):
                    break
                await asyncio.sleep(0.02)
            await client.chat(PROMPT, max_tokens=4)
            await client.chat(PROMPT, mode="progressive", progressive_gate="escalate", max_tokens=4)
    finally:
        await mesh.stop()
    routes = [s for s in spans.get_finished_spans() if s.name == "route"]
    routed, escalated = (dict(s.attributes or {}) for s in routes[-2:])
    assert (routed["tiermesh.route.small_below"], routed["tiermesh.route.medium_below"]) == (
        0.075,
        0.85,
    )
    assert routed["tiermesh.route.large_queue_limit"] == 8
    assert routed["tiermesh.load.small.running"] >= 0 and "tiermesh.load.large.queued" in routed
    assert "tiermesh.escalate.small_confidence" not in routed
    assert escalated["tiermesh.escalate.small_confidence"] == 0.945
    assert escalated["tiermesh.escalate.medium_below"] == 1.01
