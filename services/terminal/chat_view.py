"""Shows a chat in the terminal: JSON lines (a stable contract) or a live view whose draft is
replaced in place by the refinement. Knows the SDK's event types, not gRPC."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text
from tiermesh.client import (
    ChatError,
    DeltaEvent,
    Event,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
    event_to_json,
)

JsonFields = dict[str, Any]  # fields added to a --json line


def print_json_events(events: Iterable[Event], started: float) -> int:
    """One JSON object per event per line; an error becomes {"type": "error", ...}. Exit code."""
    try:
        print_json_answer(events, started)
    except ChatError as e:
        print_json_error(e, started)
        return 1
    return 0


def print_json_answer(
    events: Iterable[Event], started: float, extra: Callable[[Event], JsonFields] | None = None
) -> FinalEvent | None:
    """Prints each event as its `--json` line, with `extra(event)`'s fields added (fields are
    only ever added to the contract); returns the final event. A ChatError propagates."""
    final = None
    for event in events:
        t_ms = (time.perf_counter() - started) * 1000
        line = event_to_json(event, t_ms) | (extra(event) if extra else {})
        print(json.dumps(line, ensure_ascii=False), flush=True)
        if isinstance(event, FinalEvent):
            final = event
    return final


def print_json_error(error: ChatError, started: float, extra: JsonFields | None = None) -> None:
    """The {"type": "error", ...} line of a chat that failed, with `extra`'s fields added."""
    t_ms = (time.perf_counter() - started) * 1000
    line = {"type": "error", "t_ms": round(t_ms, 3), "code": error.code, "message": error.message}
    line |= {  # google.rpc details, when the server sent them
        "retry_after_s": error.details.retry_after_s,
        "reason": error.details.reason,
        "field_violations": [list(v) for v in error.details.field_violations],
    }
    print(json.dumps(line | (extra or {}), ensure_ascii=False), flush=True)


class RevisionView:
    """The text on screen: the current revision, replaced in place when a new one starts."""

    def __init__(self) -> None:
        self.route = ""
        self.title = ""
        self.text = ""
        self.footer = ""
        self.style = "yellow"

    def apply(self, event: Event) -> None:
        if isinstance(event, RouteEvent):
            self.route = f"{event.mode} → {' then '.join(event.tiers)} ({event.reason})"
        elif isinstance(event, RevisionStartEvent):
            role = "draft" if event.revision == 0 else f"revision {event.revision}"
            self.title = f"{role} · {event.tier}"
            self.text = ""
            self.style = "yellow" if event.revision == 0 else "cyan"
        elif isinstance(event, DeltaEvent):
            self.text += event.text
        elif isinstance(event, RevisionEndEvent) and event.error:
            self.footer = f"revision {event.revision} ended: {event.finish_reason} ({event.error})"
        elif isinstance(event, FinalEvent):
            self.text = event.text
            self.title = f"answer · revision {event.revision} · {event.tier}"
            self.style = "green"
            t = event.timings
            self.footer = (
                f"{event.reason} · first token {t.get('ttft_ms', 0):.0f} ms"
                f" · final {t.get('time_to_final_ms', 0):.0f} ms"
            )

    def render(self) -> Group:
        body = Panel(Text(self.text or "…"), title=self.title, border_style=self.style)
        return Group(Text(self.route, style="dim"), body, Text(self.footer, style="dim"))


def show_live(events: Iterable[Event], console: Console | None = None) -> int:
    """Renders the chat live; returns the exit code (1 on a chat error)."""
    console = console or Console()
    try:
        show_answer(events, console)
    except ChatError as e:
        show_error(e, console)
        return 1
    return 0


def show_answer(events: Iterable[Event], console: Console) -> FinalEvent | None:
    """Renders one answer live, the draft replaced in place by each new revision, and returns
    its final event. A ChatError (or Ctrl-C) propagates, the answer so far left on screen."""
    view = RevisionView()
    final = None
    with Live(view.render(), console=console, refresh_per_second=20) as live:
        for event in events:
            view.apply(event)
            live.update(view.render())
            if isinstance(event, FinalEvent):
                final = event
    console.print()
    return final


def show_error(error: ChatError, console: Console) -> None:
    console.print(f"[red]error[/red] {error.code}: {error.message}")
