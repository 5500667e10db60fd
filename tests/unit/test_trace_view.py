"""`tiermesh trace`'s tree over span-file records: a trace linked from a caller's span in the file
hangs under that span, below the caller's trace; a link to a span the file does not have, or
to one of the same trace, changes nothing."""

from __future__ import annotations

from typing import Any

from rich.tree import Tree

from services.cli.trace_view import build_tree

CALLER_TRACE, ROUTER_TRACE = "a" * 32, "b" * 32


def record(
    span_id: str,
    name: str,
    trace_id: str,
    start_ns: int,
    parent_id: str | None = None,
    links: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_id": parent_id,
        "name": name,
        "service": "test",
        "start_ns": start_ns,
        "end_ns": start_ns + 1_000_000,
        "status": "OK",
        "attributes": {},
        "links": links or [],
    }


def names(node: Tree) -> list[Any]:
    """[name, [children...]] for each child of `node`, by the span name in its label."""
    return [
        [str(c.label).split("[/bold]")[0].removeprefix("[bold]"), names(c)] for c in node.children
    ]


def router_trace(link_to: str, link_trace: str = CALLER_TRACE) -> list[dict[str, Any]]:
    return [
        record(
            "r1",
            "router Chat",
            ROUTER_TRACE,
            2,
            links=[{"trace_id": link_trace, "span_id": link_to}],
        ),
        record("r2", "route", ROUTER_TRACE, 3, parent_id="r1"),
        record("r3", "chat small", ROUTER_TRACE, 4, parent_id="r1"),
    ]


def test_a_trace_linked_from_a_callers_span_hangs_under_it() -> None:
    caller = [record("g1", "chat tiermesh-routed", CALLER_TRACE, 1)]
    router = router_trace("g1")
    tree = build_tree(router, caller + router)
    assert str(tree.label) == f"trace {CALLER_TRACE}, linked trace {ROUTER_TRACE}"
    assert names(tree) == [
        ["chat tiermesh-routed", [["router Chat", [["route", []], ["chat small", []]]]]]
    ]


def test_a_link_the_file_cannot_follow_leaves_the_trace_alone() -> None:
    unknown = router_trace("g9")  # the caller's span is not in the file
    tree = build_tree(unknown, unknown)
    assert str(tree.label) == f"trace {ROUTER_TRACE}"
    assert names(tree) == [["router Chat", [["route", []], ["chat small", []]]]]
    # a link whose trace id is not the linked span's own is not followed either
    caller = [record("g1", "chat tiermesh-routed", CALLER_TRACE, 1)]
    mismatched = router_trace("g1", link_trace="c" * 32)
    tree = build_tree(mismatched, caller + mismatched)
    assert str(tree.label) == f"trace {ROUTER_TRACE}"
    assert [n for n, _ in names(tree)] == ["router Chat"]


def test_an_engine_span_shows_what_vllm_measured_inside_itself() -> None:
    prefill = record("t1", "engine prefill", ROUTER_TRACE, 1)
    prefill["attributes"] = {
        "tiermesh.tier": "large",
        "tiermesh.engine.scheduler_wait_ms": 0.03,
        "tiermesh.engine.prefill_ms": 103.5,
        "tiermesh.engine.cached_prompt_tokens": 128,
    }
    (node,) = build_tree([prefill], [prefill]).children
    assert "tier=large scheduler_wait_ms=0.03 prefill_ms=103.5 cached_prompt_tokens=128" in str(
        node.label
    )
