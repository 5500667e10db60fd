"""How `tiermesh top` looks: one table row per tier replica (queue, running, KV pool, decode
busy share, tokens/s, TTFT p50, model and its last hot swap), drawn live with rich, and the
`--once --json` snapshot.

Draws the plain snapshot dicts it is given (the JSON contract in the README); knows nothing of
gRPC, of where the numbers come from, or of the router's and tiers' code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

Snapshot = dict[str, Any]  # {"t", "router", "tiers": [row, ...]}: README, "tiermesh top"
COLUMNS = (
    "tier",
    "replica",
    "serving",
    "queued",
    "running",
    "KV pool",
    "decode busy",
    "tokens/s",
    "TTFT p50",
    "model",
)


def print_json_snapshot(snapshot: Snapshot) -> None:
    """The `--once --json` form: one JSON object on one line."""
    print(json.dumps(snapshot))


def snapshot_table(snapshot: Snapshot) -> Table:
    """The snapshot as a table; a replica that did not answer shows its error instead."""
    router = snapshot.get("router")
    title = "tiermesh top"
    if router is not None:
        state = {True: "SERVING", False: "NOT SERVING", None: "unreachable"}[router["serving"]]
        title += f" (router {router['address']}: {state})"
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(
            column, justify="left" if column in ("tier", "replica", "model") else "right"
        )
    for row in snapshot["tiers"]:
        if row.get("error"):
            blanks = [""] * (len(COLUMNS) - 4)
            table.add_row(row["tier"], row["address"], "[red]down[/red]", *blanks, row["error"])
            continue
        table.add_row(
            row["tier"],
            row["address"],
            "yes" if row["serving"] else "[yellow]no[/yellow]",
            f"{row['queued']}/{row['max_queued']}" + _batch_note(row),
            f"{row['running']}/{row['max_running']}" + _waiting_note(row),
            _kv_cell(row),
            f"{row['decode_busy_share']:.0%}",
            f"{row['tokens_per_s']:.1f}",
            f"{row['ttft_ms_p50']:.0f} ms" if row["ttft_ms_p50"] else "-",
            row["model"] + _swap_note(row.get("last_swap"), snapshot["t"]),
        )
    return table


def _swap_note(swap: dict[str, Any] | None, now: float) -> str:
    """What follows a replica's model: when it last swapped ("(swapped 12 s ago)"), or the
    swap under way, or the one that failed."""
    if not swap:
        return ""
    ago = max(0.0, now - swap["started_unix_s"])
    if swap["phase"] == "failed":
        return f" [red](swap failed {ago:.0f} s ago)[/red]"
    if swap["phase"] == "done":
        return f" (swapped {ago:.0f} s ago)"
    return f" [yellow](swap: {swap['phase']})[/yellow]"


def _kv_cell(row: dict[str, Any]) -> str:
    capacity = row["kv_pool_capacity_tokens"]
    if not capacity:
        return "-"
    cell = f"{row['kv_pool_used_tokens']}/{capacity} ({row['kv_pool_use_share']:.0%} avg)"
    if hits := row.get("prefix_cache_hit_rate"):  # an engine with a prefix cache (vllm)
        cell += f", prefix hits {hits:.0%}"
    return cell


def _waiting_note(row: dict[str, Any]) -> str:
    """After running: the batch requests paused for critical ones, and the requests an engine
    with its own scheduler (vllm) holds unscheduled (waiting for KV-cache blocks, or
    preempted), when there are any."""
    notes = []
    if paused := row.get("paused", 0):
        notes.append(f"{paused} paused")
    if waiting := row.get("engine_waiting", 0):
        notes.append(f"{waiting} waiting")
    return f" ({', '.join(notes)})" if notes else ""


def _batch_note(row: dict[str, Any]) -> str:
    """After queued: how many of the waiting requests are batch, when any are."""
    batch = row.get("queued_batch", 0)
    return f" ({batch} batch)" if batch else ""


def show_top(
    take_snapshot: Callable[[], Snapshot],
    interval_s: float = 1.0,
    console: Console | None = None,
    rounds: int | None = None,
) -> None:
    """Redraws the table from `take_snapshot` every `interval_s` until Ctrl-C (or `rounds`)."""
    console = console or Console()
    done = 0
    with Live(snapshot_table(take_snapshot()), console=console, auto_refresh=False) as live:
        while rounds is None or done < rounds:
            time.sleep(interval_s)
            live.update(snapshot_table(take_snapshot()), refresh=True)
            done += 1
