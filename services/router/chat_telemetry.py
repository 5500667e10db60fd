"""Traces and metrics of one chat through the router: the Chat server span, the route decision,
one span per revision, one client span per tier call (carrying trace context to the tier), and
the progressive-streaming metrics (time to first draft, time to final, revisions, refinements).

Knows OpenTelemetry and the protobuf messages; makes no calls itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Counter, Histogram
from opentelemetry.trace import SpanKind
from tiermesh.v1 import common_pb2, router_pb2

from services.common.telemetry import end_span, extract_context, inject_metadata, meter, tracer

MODE_NAMES = {1: "routed", 2: "progressive", 3: "pinned"}


class RouterMetrics:
    def __init__(self) -> None:
        m = meter()
        self.route_decisions: Counter = m.create_counter(
            "tiermesh.route.decisions", description="Route decisions by tier, policy and mode"
        )
        self.token_usage: Histogram = m.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens per tier call"
        )
        self.first_draft: Histogram = m.create_histogram(
            "tiermesh.chat.time_to_first_draft", unit="s", description="Request to first delta"
        )
        self.final: Histogram = m.create_histogram(
            "tiermesh.chat.time_to_final", unit="s", description="Request to the final answer"
        )
        self.revisions: Histogram = m.create_histogram(
            "tiermesh.chat.revisions", unit="{revision}", description="Revisions per chat"
        )
        self.refinements: Counter = m.create_counter(
            "tiermesh.chat.refinements",
            description="Progressive refinements by outcome (completed, failed, timeout, "
            "skipped, cancelled)",
        )


@cache
def router_metrics() -> RouterMetrics:
    return RouterMetrics()


class TierCallSpan:
    """The client span of one tier call; ended exactly once with the call's status."""

    def __init__(self, parent: Context, tier: str, request_id: str) -> None:
        self.span = tracer().start_span(
            f"tier {tier} Generate",
            context=parent,
            kind=SpanKind.CLIENT,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": "tiermesh.v1.TierService",
                "rpc.method": "Generate",
                "tiermesh.tier": tier,
                "tiermesh.request_id": request_id,
            },
        )
        self.metadata = inject_metadata(trace.set_span_in_context(self.span))
        self._tier = tier
        self._ended = False

    def end(self, code: str, message: str = "", usage: common_pb2.Usage | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        if usage is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            self.span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            metrics = router_metrics()
            for kind, count in (
                ("input", usage.prompt_tokens),
                ("output", usage.completion_tokens),
            ):
                attributes = {"gen_ai.token.type": kind, "tiermesh.tier": self._tier}
                metrics.token_usage.record(count, attributes)
        end_span(self.span, code, message)


class ChatTelemetry:
    def __init__(self, metadata: Sequence[tuple[str, Any]] | None) -> None:
        self.span = tracer().start_span(
            "router Chat",
            context=extract_context(metadata),
            kind=SpanKind.SERVER,
            attributes={
                "rpc.system": "grpc",
                "rpc.service": "tiermesh.v1.RouterService",
                "rpc.method": "Chat",
                "gen_ai.operation.name": "chat",
            },
        )
        self.context = trace.set_span_in_context(self.span)
        self._revisions: dict[int, trace.Span] = {}
        self.mode = ""

    def route(self, decision: router_pb2.RouteDecision, max_tokens: int, start_ns: int) -> None:
        self.mode = MODE_NAMES.get(decision.mode, "routed")
        attributes: dict[str, Any] = {
            "tiermesh.request_id": decision.request_id,
            "tiermesh.mode": self.mode,
            "tiermesh.tiers": list(decision.tiers),
            "tiermesh.policy": decision.policy,
            "tiermesh.reason": decision.reason,
            "tiermesh.complexity": decision.complexity,
            "gen_ai.request.model": decision.tiers[0] if decision.tiers else "",
            "gen_ai.request.max_tokens": max_tokens,
        }
        self.span.set_attributes(attributes)
        route = tracer().start_span("route", context=self.context, start_time=start_ns)
        route.set_attributes(attributes)
        route.end()
        router_metrics().route_decisions.add(
            1,
            {
                "tiermesh.tier": decision.tiers[-1] if decision.tiers else "",
                "tiermesh.policy": decision.policy,
                "tiermesh.mode": self.mode,
            },
        )

    def tier_call(self, tier: str, request_id: str) -> TierCallSpan:
        return TierCallSpan(self.context, tier, request_id)

    def revision_started(self, revision: int, tier: str, kept_prefix_chars: int) -> None:
        span = tracer().start_span(f"revision {revision}", context=self.context)
        span.set_attributes(
            {
                "tiermesh.revision": revision,
                "tiermesh.tier": tier,
                "tiermesh.kept_prefix_chars": kept_prefix_chars,
            }
        )
        self._revisions[revision] = span

    def revision_ended(self, revision: int, finish_reason: str, error: str = "") -> None:
        span = self._revisions.pop(revision, None)
        if span is None:
            return
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        end_span(span, "OK" if not error else "UNKNOWN", error)

    def final(self, final: router_pb2.Final, refinement: str | None) -> None:
        metrics = router_metrics()
        attributes = {"tiermesh.mode": self.mode}
        t = final.timings
        if t.time_to_first_draft_ms:
            metrics.first_draft.record(t.time_to_first_draft_ms / 1000, attributes)
        metrics.final.record(t.time_to_final_ms / 1000, attributes)
        metrics.revisions.record(final.revisions, attributes)
        if refinement is not None:
            metrics.refinements.add(1, {"tiermesh.outcome": refinement})
        self.span.set_attributes(
            {
                "tiermesh.final.revision": final.revision,
                "tiermesh.final.tier": final.tier,
                "tiermesh.final.reason": final.reason,
                "tiermesh.time_to_first_draft_ms": t.time_to_first_draft_ms,
                "tiermesh.time_to_final_ms": t.time_to_final_ms,
                "gen_ai.response.model": final.tier,
                "gen_ai.usage.output_tokens": sum(u.usage.completion_tokens for u in final.usage),
                "gen_ai.usage.input_tokens": sum(u.usage.prompt_tokens for u in final.usage),
            }
        )

    def finish(self, code: str, message: str = "") -> None:
        for revision in list(self._revisions):
            self.revision_ended(revision, "cancelled" if code == "CANCELLED" else "error", code)
        if code == "CANCELLED" and self.mode == "progressive":
            router_metrics().refinements.add(1, {"tiermesh.outcome": "cancelled"})
        end_span(self.span, code, message)
