"""What the router's edge keeps of a caller's trace context and baggage (services/common/
telemetry.py edge_context): nothing unless trusted, the caller's span as a link."""

from __future__ import annotations

import pytest
from opentelemetry import baggage, trace

from services.common.telemetry import TRUST_TRACE_CONTEXT_ENV, edge_context

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0aa9aa"
SPAN_ID = "00f067aa0ba902b7"
METADATA = [
    ("traceparent", f"00-{TRACE_ID}-{SPAN_ID}-01"),
    ("baggage", "tenant=someone-else"),
    ("authorization", "Bearer x"),
]


def test_untrusted_callers_get_a_new_root_and_a_link(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_TRACE_CONTEXT_ENV, raising=False)
    context, links = edge_context(METADATA)
    assert not trace.get_current_span(context).get_span_context().is_valid
    assert baggage.get_all(context) == {}
    (link,) = links
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == (TRACE_ID, SPAN_ID)


def test_no_caller_context_no_link(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRUST_TRACE_CONTEXT_ENV, raising=False)
    assert edge_context([("baggage", "tenant=x")])[1] == []


def test_trusted_callers_are_continued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRUST_TRACE_CONTEXT_ENV, "1")
    context, links = edge_context(METADATA)
    assert f"{trace.get_current_span(context).get_span_context().trace_id:032x}" == TRACE_ID
    assert baggage.get_all(context) == {"tenant": "someone-else"}
    assert links == []
