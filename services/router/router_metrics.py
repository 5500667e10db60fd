"""The router's OpenTelemetry instruments, made once per process: route decisions and step-downs
(counters), token usage, the GenAI request and operation durations, and the progressive-streaming
histograms (time to first draft, time to final, revisions) and refinement outcomes. Knows only
the meter; chat_telemetry.py records into them.
"""

from __future__ import annotations

from functools import cache

from opentelemetry.metrics import Counter, Histogram

from services.common.genai_conventions import CLIENT_DURATION, SERVER_DURATION
from services.common.telemetry import meter


class RouterMetrics:
    """The router's instruments; one per process (router_metrics)."""

    def __init__(self) -> None:
        m = meter()
        self.route_decisions: Counter = m.create_counter(
            "tiermesh.route.decisions", description="Route decisions by tier, policy and mode"
        )
        self.token_usage: Histogram = m.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Tokens per tier call"
        )
        self.request_duration: Histogram = m.create_histogram(
            SERVER_DURATION.name, unit="s", description=SERVER_DURATION.description
        )
        self.operation_duration: Histogram = m.create_histogram(
            CLIENT_DURATION.name, unit="s", description=CLIENT_DURATION.description
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
        self.step_downs: Counter = m.create_counter(
            "tiermesh.route.step_downs",
            description="Routed chats moved off their tier by overload, by from/to tier and "
            "priority",
        )
        self.refinements: Counter = m.create_counter(
            "tiermesh.chat.refinements",
            description="Progressive refinements by outcome (completed, failed, timeout, "
            "skipped, cancelled)",
        )


@cache
def router_metrics() -> RouterMetrics:
    return RouterMetrics()
