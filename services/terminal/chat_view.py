"""Shows a chat in the terminal: JSON lines (a stable contract) or a live view whose draft is
replaced in place by the refinement. Knows the SDK's event types, not gRPC."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

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


def print_json_events(events: Iterable[Event], started: float) -> int:
    """One JSON object per event per line; an error becomes {"type": "error", ...}. Exit code."""
    try:
        for event in events:
            t_ms = (time.perf_counter() - started) * 1000
            print(json.dumps(event_to_json(event, t_ms), ensure_ascii=False), flush=True)
    except ChatError as e:
        t_ms = (time.perf_counter() - started) * 1000
        error = {"type": "error", "t_ms": round(t_ms, 3), "code": e.code, "message": e.message}
        error |= {  # google.rpc details, when the server sent them
            "retry_after_s": e.details.retry_after_s,
            "reason": e.details.reason,
            "field_violations": [list(v) for v in e.details.field_violations],
        }
        print(json.dumps(error, ensure_ascii=False), flush=True)
        return 1
    return 0


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
    view = RevisionView()
    try:
        with Live(view.render(), console=console, refresh_per_second=20) as live:
            for event in events:
                view.apply(event)
                live.update(view.render())
        console.print()
    except ChatError as e:
        console.print(f"[red]error[/red] {e.code}: {e.message}")
        return 1
    return 0
