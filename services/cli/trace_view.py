"""`tiermesh trace`: shows the span tree of a recent request from the JSON-lines span file the
services write (TIERMESH_TRACE_FILE; `tiermesh run` sets it), with each span's offset and
duration. Needs no tracing backend. Knows the file's records, not OpenTelemetry's SDK.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.tree import Tree

from services.common import env

ROOT_NAMES = ("chat", "router Chat")


def default_trace_file() -> Path:
    return Path(os.environ.get("TIERMESH_TRACE_FILE") or Path(env.run_dir()) / "traces.jsonl")


def load_spans(path: Path) -> list[dict[str, Any]]:
    spans = []
    for candidate in (Path(f"{path}.1"), path):
        if candidate.is_file():
            for line in candidate.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    spans.append(json.loads(line))
    return spans


def pick_trace(
    spans: list[dict[str, Any]], request_id: str | None, trace_id: str | None
) -> list[dict[str, Any]]:
    """The spans of one trace: by trace id, by request id, or the latest chat."""
    if trace_id is None:
        candidates = [
            s
            for s in spans
            if s["name"] in ROOT_NAMES
            and (request_id is None or s["attributes"].get("tiermesh.request_id") == request_id)
        ]
        if not candidates:
            return []
        trace_id = max(candidates, key=lambda s: s["start_ns"])["trace_id"]
    return [s for s in spans if s["trace_id"] == trace_id]


def build_tree(spans: list[dict[str, Any]], others: Sequence[dict[str, Any]] = ()) -> Tree:
    """The span tree of one trace. A span of it that links to a span among `others` in another
    trace (the router's link to the gateway's or the SDK's span, whose context it did not trust)
    hangs under that span, in that caller's trace shown above it: one tree from the caller to
    the engine, the link said on the linked span."""
    known = {s["span_id"]: s for s in others}
    trace_id = spans[0]["trace_id"]
    # each span's callers: the spans in other traces it links to
    callers = {
        span["span_id"]: [c for c in _link_targets(span, known) if c["trace_id"] != trace_id]
        for span in spans
    }
    caller_traces = sorted({c["trace_id"] for found in callers.values() for c in found})
    joined = [s for s in others if s["trace_id"] in caller_traces] + spans
    ids = {s["span_id"] for s in joined}
    by_parent: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for span in joined:
        parent = span["parent_id"] if span["parent_id"] in ids else None
        if parent is None and callers.get(span["span_id"]):
            parent = callers[span["span_id"]][0]["span_id"]
        by_parent[parent].append(span)
    start = min(s["start_ns"] for s in joined)
    tree = Tree(", linked ".join(f"trace {t}" for t in [*caller_traces, trace_id]))

    def add(node: Tree, parent: str | None) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: s["start_ns"]):
            offset = (span["start_ns"] - start) / 1e6
            duration = (span["end_ns"] - span["start_ns"]) / 1e6
            status = "" if span["status"] in ("OK", "UNSET") else f" [red]{span['status']}[/red]"
            detail = _detail(span["attributes"]) + _linked(span, known)
            label = (
                f"[bold]{span['name']}[/bold] [dim]{span['service']}[/dim] "
                f"+{offset:.1f} ms, {duration:.1f} ms{status}{detail}"
            )
            add(node.add(label), span["span_id"])

    add(tree, None)
    return tree


def _link_targets(span: dict[str, Any], known: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans in the file `span` links to, each in the trace its link names."""
    return [
        known[link["span_id"]]
        for link in span.get("links", [])  # records written before links were kept have none
        if link["span_id"] in known and known[link["span_id"]]["trace_id"] == link["trace_id"]
    ]


def _linked(span: dict[str, Any], known: dict[str, dict[str, Any]]) -> str:
    """`linked from <name> <service> (trace <id>)` for each linked span in the file."""
    parts = [
        f"linked from {other['name']} {other['service']} (trace {other['trace_id']})"
        for other in _link_targets(span, known)
    ]
    return f" [dim]{'; '.join(parts)}[/dim]" if parts else ""


def _detail(attributes: dict[str, Any]) -> str:
    keys = (
        "tiermesh.mode",
        "tiermesh.policy",
        "tiermesh.tier",
        "tiermesh.revision",
        "gen_ai.usage.output_tokens",
        "gen_ai.response.finish_reasons",
        "tiermesh.final.reason",
        # what an engine with its own scheduler (vLLM) measured inside itself
        "tiermesh.engine.scheduler_wait_ms",
        "tiermesh.engine.prefill_ms",
        "tiermesh.engine.cached_prompt_tokens",
        "tiermesh.engine.decode_ms",
        "tiermesh.engine.preemptions",
    )
    parts = [f"{k.split('.')[-1]}={attributes[k]}" for k in keys if k in attributes]
    return f" [cyan]{' '.join(parts)}[/cyan]" if parts else ""


def cmd_trace(args: argparse.Namespace) -> int:
    console = Console()
    path = args.file or default_trace_file()
    spans = load_spans(path)
    if not spans:
        console.print(f"[red]tiermesh trace:[/red] no spans in {path} (is the mesh running?)")
        return 1
    chosen = pick_trace(spans, args.request_id, args.trace_id)
    if not chosen:
        console.print("[red]tiermesh trace:[/red] no matching trace")
        return 1
    if args.json:
        print(json.dumps(sorted(chosen, key=lambda s: s["start_ns"])))
    else:
        console.print(build_tree(chosen, spans))
    return 0


def register(commands: Any) -> None:
    trace = commands.add_parser("trace", help="show the span tree of a recent request")
    trace.add_argument("--file", type=Path, help="span file (default: $TIERMESH_TRACE_FILE)")
    trace.add_argument("--request-id", help="the chat's request id (default: the latest chat)")
    trace.add_argument("--trace-id", help="a trace id (32 hex digits)")
    trace.add_argument("--json", action="store_true", help="the spans as one JSON list")
    trace.set_defaults(func=cmd_trace)
