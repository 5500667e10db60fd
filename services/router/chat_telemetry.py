"""Traces and metrics of one chat through the router: the Chat server span, the route decision,
one span per revision, one client span per tier call (`chat <tier>`, carrying trace context to
the tier), the GenAI durations (the chat's gen_ai.server.request.duration, each tier call's
gen_ai.client.operation.duration) and the progressive-streaming metrics (time to first draft,
time to final, revisions, refinements).

ChatTelemetry observes a chat session's events (chat_events.py) as the servicer relays them; the
session never calls it. With tracing off (no tracer provider) it builds no span, attribute or
trace context; with metrics off it records nothing; with both off `chat_telemetry` gives
NO_TELEMETRY, which does no work at all. Knows OpenTelemetry and the protobuf messages; makes no
calls itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind
from tiermesh.client.requests import MODE_NAMES, PRIORITY_NAMES
from tiermesh.v1 import router_pb2

from services.common.genai_conventions import (
    error_type,
    genai_attributes,
    span_name,
)
from services.common.telemetry import (
    TRUST_TRACE_CONTEXT_ENV,
    edge_context,
    end_span,
    inject_metadata,
    metrics_on,
    rpc_attributes,
    tracer,
    tracing_on,
)
from services.router.chat_events import (
    RefinementSettled,
    SessionEvent,
    TierCallEnded,
    TierCallOpening,
)
from services.router.escalation import Escalation
from services.router.policy import TierLoad
from services.router.router_metrics import router_metrics


class TierCallSpan:
    """The client span of one tier call, `chat <tier>`, when `traced` (else `parent`, if any,
    travels on as it is); ended exactly once with the call's status, recording the call's
    duration and tokens when `metered`."""

    def __init__(
        self,
        parent: Context | None,
        tier: str,
        request_id: str,
        traced: bool = True,
        metered: bool = True,
    ) -> None:
        self.span: trace.Span | None = None
        self.metadata: list[tuple[str, str]] = []
        if not traced:
            self.metadata = inject_metadata(parent) if parent is not None else []
        else:
            self.span = tracer().start_span(
                span_name(tier),
                context=parent,
                kind=SpanKind.CLIENT,
                attributes={
                    **rpc_attributes("tiermesh.v1.TierService/Generate"),
                    **genai_attributes(tier),
                    "tiermesh.tier": tier,
                    "tiermesh.request_id": request_id,
                },
            )
            self.metadata = inject_metadata(trace.set_span_in_context(self.span))
        self._metered = metered
        self._tier = tier
        self._started = time.perf_counter()
        self._ended = False

    def end(self, ended: TierCallEnded | None = None) -> None:
        """Ends the span with `ended`'s status, or as cancelled by the router without it."""
        if self._ended:
            return
        self._ended = True
        if ended is None:
            ended = TierCallEnded(self._tier, "", "CANCELLED", "cancelled by the router")
        if self._metered:
            self._record(ended)
        span = self.span
        if span is None:
            return
        if ended.endpoint:
            span.set_attributes(server_address(ended.endpoint))
        if ended.model:
            span.set_attribute("gen_ai.response.model", ended.model)
        if ended.usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", ended.usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", ended.usage.completion_tokens)
        end_span(span, ended.code, ended.message)

    def _record(self, ended: TierCallEnded) -> None:
        """The call's duration and, when it finished, its tokens."""
        metrics = router_metrics()
        attributes = {**genai_attributes(self._tier, ended.model), "tiermesh.tier": self._tier}
        error = error_type(ended.code)
        metrics.operation_duration.record(
            time.perf_counter() - self._started,
            {**attributes, "error.type": error} if error else attributes,
        )
        if ended.usage is not None:
            usage = ended.usage
            for kind, count in (
                ("input", usage.prompt_tokens),
                ("output", usage.completion_tokens),
            ):
                metrics.token_usage.record(count, {**attributes, "gen_ai.token.type": kind})


def server_address(endpoint: str) -> dict[str, str | int]:
    """`server.address` (and `server.port`) of a tier replica's target: "host:port" or an
    xds:/// target (its name)."""
    if endpoint.startswith("xds:"):
        return {"server.address": endpoint.split("/")[-1]}
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        return {"server.address": endpoint}
    return {"server.address": host.strip("[]"), "server.port": int(port)}


class ChatTelemetry:
    """The spans and metrics of one chat: the servicer calls route() once planned and finish()
    at the end, and hands it every session event in between (observe). Spans only when
    `traced`, metrics only when `metered` (chat_telemetry() reads both from the process)."""

    def __init__(
        self,
        metadata: Sequence[tuple[str, Any]] | None,
        traced: bool = True,
        metered: bool = True,
        start_ns: int | None = None,
    ) -> None:
        self.span: trace.Span | None = None
        # the chat span's context, parent of the others; untraced, a trusted caller's own
        self.context: Context | None = None
        self._traced = traced
        if not traced:
            self.context = _trusted_caller(metadata)
        else:
            context, links = edge_context(metadata)  # callers' context trusted only if set
            self.span = tracer().start_span(
                "router Chat",
                context=context,
                kind=SpanKind.SERVER,
                links=links,
                start_time=start_ns,
                attributes={
                    **rpc_attributes("tiermesh.v1.RouterService/Chat"),
                    **genai_attributes(""),
                },
            )
            self.context = trace.set_span_in_context(self.span)
        self._metered = metered
        self._started = time.perf_counter()
        self._revisions: dict[int, trace.Span] = {}
        self._tier_calls: dict[str, TierCallSpan] = {}  # by the tier request's id
        self.mode = ""
        self.request_model = ""  # the tier meant to give the answer, once routed
        self.response_model = ""  # the model that gave it (Final.model)

    def route(
        self,
        decision: router_pb2.RouteDecision,
        max_tokens: int,
        start_ns: int,
        explained: Mapping[str, Any] | None = None,
    ) -> None:
        """The route span (and the chat span's route attributes); `explained`: what the policy
        read (route_explanation), added to both."""
        self.mode = MODE_NAMES.get(decision.mode, "routed")
        # ROUTED and PINNED: the one tier; PROGRESSIVE: the refine tier (the draft's is its call's)
        self.request_model = decision.tiers[-1] if decision.tiers else ""
        priority = PRIORITY_NAMES.get(decision.priority, "interactive")
        if self._metered:
            router_metrics().route_decisions.add(
                1,
                {
                    "tiermesh.tier": self.request_model,
                    "tiermesh.policy": decision.policy,
                    "tiermesh.mode": self.mode,
                },
            )
            if decision.stepped_from:
                router_metrics().step_downs.add(
                    1,
                    {
                        "tiermesh.from": decision.stepped_from,
                        "tiermesh.to": self.request_model,
                        "tiermesh.priority": priority,
                    },
                )
        if self.span is None:
            return
        attributes: dict[str, Any] = {
            "tiermesh.request_id": decision.request_id,
            "tiermesh.mode": self.mode,
            "tiermesh.tiers": list(decision.tiers),
            "tiermesh.policy": decision.policy,
            "tiermesh.reason": decision.reason,
            "tiermesh.complexity": decision.complexity,
            "tiermesh.priority": priority,
            "gen_ai.request.max_tokens": max_tokens,
        }
        if decision.stepped_from:
            attributes["tiermesh.stepped_from"] = decision.stepped_from
        attributes.update(explained or {})
        if self.request_model:
            attributes["gen_ai.request.model"] = self.request_model
        self.span.set_attributes(attributes)
        route = tracer().start_span("route", context=self.context, start_time=start_ns)
        route.set_attributes(attributes)
        route.end()

    def observe(self, event: SessionEvent) -> None:
        if isinstance(event, TierCallOpening):
            span = TierCallSpan(
                self.context, event.tier, event.request_id, self._traced, self._metered
            )
            self._tier_calls[event.request_id] = span
            event.metadata.extend(span.metadata)
        elif isinstance(event, TierCallEnded):
            call = self._tier_calls.pop(event.request_id, None)
            if call is not None:
                call.end(event)
        elif isinstance(event, RefinementSettled):
            if self._metered:
                router_metrics().refinements.add(1, {"tiermesh.outcome": event.outcome})
        elif event.HasField("revision_start"):
            start = event.revision_start
            self._revision_started(start.revision, start.tier, start.kept_prefix_chars)
        elif event.HasField("revision_end"):
            end = event.revision_end
            self._revision_ended(end.revision, end.finish_reason, end.error)
        elif event.HasField("final"):
            self._final(event.final)

    def _revision_started(self, revision: int, tier: str, kept_prefix_chars: int) -> None:
        if self.span is None:
            return
        span = tracer().start_span(f"revision {revision}", context=self.context)
        span.set_attributes(
            {
                "tiermesh.revision": revision,
                "tiermesh.tier": tier,
                "tiermesh.kept_prefix_chars": kept_prefix_chars,
            }
        )
        self._revisions[revision] = span

    def _revision_ended(self, revision: int, finish_reason: str, error: str = "") -> None:
        span = self._revisions.pop(revision, None)
        if span is None:
            return
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        end_span(span, "OK" if not error else "UNKNOWN", error)

    def _final(self, final: router_pb2.Final) -> None:
        t = final.timings
        self.response_model = final.model
        if self._metered:
            metrics = router_metrics()
            attributes = {"tiermesh.mode": self.mode}
            if t.time_to_first_draft_ms:
                metrics.first_draft.record(t.time_to_first_draft_ms / 1000, attributes)
            metrics.final.record(t.time_to_final_ms / 1000, attributes)
            metrics.revisions.record(final.revisions, attributes)
        if self.span is None:
            return
        self.span.set_attributes(
            {
                "tiermesh.final.revision": final.revision,
                "tiermesh.final.tier": final.tier,
                "tiermesh.final.reason": final.reason,
                "tiermesh.time_to_first_draft_ms": t.time_to_first_draft_ms,
                "tiermesh.time_to_final_ms": t.time_to_final_ms,
                "gen_ai.response.model": final.model or final.tier,
                "gen_ai.usage.output_tokens": sum(u.usage.completion_tokens for u in final.usage),
                "gen_ai.usage.input_tokens": sum(u.usage.prompt_tokens for u in final.usage),
            }
        )

    def finish(self, code: str, message: str = "") -> None:
        """Ends the chat span and records the chat's duration; what is still open (the session
        stopped early) ends with it."""
        for request_id in list(self._tier_calls):
            self._tier_calls.pop(request_id).end()
        for revision in list(self._revisions):
            self._revision_ended(revision, "cancelled" if code == "CANCELLED" else "error", code)
        if self._metered:
            metrics = router_metrics()
            if code == "CANCELLED" and self.mode == "progressive":
                metrics.refinements.add(1, {"tiermesh.outcome": "cancelled"})
            attributes = genai_attributes(self.request_model, self.response_model, error_type(code))
            metrics.request_duration.record(
                time.perf_counter() - self._started, {**attributes, "tiermesh.mode": self.mode}
            )
        end_span(self.span, code, message)


class NoTelemetry:
    """A chat's telemetry when neither traces nor metrics are on: nothing to build or record."""

    def route(
        self,
        decision: router_pb2.RouteDecision,
        max_tokens: int,
        start_ns: int,
        explained: Mapping[str, Any] | None = None,
    ) -> None:
        return None

    def observe(self, event: SessionEvent) -> None:
        return None

    def finish(self, code: str, message: str = "") -> None:
        return None


NO_TELEMETRY = NoTelemetry()


def chat_telemetry(
    metadata: Sequence[tuple[str, Any]] | None, start_ns: int | None = None
) -> ChatTelemetry | NoTelemetry:
    """One chat's telemetry, as this process has it on: NO_TELEMETRY when it has neither a
    tracer nor a meter provider, and no trusted caller context to pass on to the tiers. The
    chat's span starts at `start_ns` (time.time_ns() when the chat came in; default: now), the
    time its `route` span starts at too, so no child starts before it."""
    traced, metered = tracing_on(), metrics_on()
    if not traced and not metered and _trusted_caller(metadata) is None:
        return NO_TELEMETRY
    return ChatTelemetry(metadata, traced, metered, start_ns)


def _trusted_caller(metadata: Sequence[tuple[str, Any]] | None) -> Context | None:
    """The caller's trace context when the router trusts it (TIERMESH_TRUST_TRACE_CONTEXT=1) and
    the caller sent one: with tracing off it still travels on to the tiers, as it would through
    a no-op span."""
    if not metadata or os.environ.get(TRUST_TRACE_CONTEXT_ENV) != "1":
        return None
    if not any(key == "traceparent" for key, _ in metadata):
        return None
    return edge_context(metadata)[0]


def route_explanation(
    policy: object, loads: Mapping[str, TierLoad | None], escalation: Escalation | None
) -> dict[str, Any]:
    """What `tiermesh route explain` shows of a decision, as span attributes: the policy's
    thresholds on the complexity score and its large-queue limit (where it has them), the
    escalate gate's thresholds, and the load the router read of each tier."""
    out: dict[str, Any] = {}
    thresholds = getattr(policy, "thresholds", None)
    if thresholds is not None:
        out["tiermesh.route.small_below"], out["tiermesh.route.medium_below"] = thresholds
    limit = getattr(policy, "large_queue_limit", None)
    if limit is not None:
        out["tiermesh.route.large_queue_limit"] = limit
    if escalation is not None:
        out |= {f"tiermesh.escalate.{k}": v for k, v in asdict(escalation).items()}
    for tier, load in loads.items():
        if load is not None:
            out[f"tiermesh.load.{tier}.running"] = load.running
            out[f"tiermesh.load.{tier}.queued"] = load.queued
            out[f"tiermesh.load.{tier}.expected_wait_ms"] = load.expected_wait_ms
    return out
