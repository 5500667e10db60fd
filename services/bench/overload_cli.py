"""`tiermesh bench --scenario overload`: its options, the command (the bench's keys and mesh
around overload_bench.run_overload) and the report on the console.

Knows argparse, rich and the order of setting up; the run is overload_bench.py's, the numbers
overload_report.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from services.bench.hybrid_bench import BenchError, LoadOptions
from services.bench.overload_bench import PRIORITY_MIX, parse_priority_mix, run_overload
from services.bench.overload_keys import bench_keys
from services.bench.overload_report import table_rows
from services.common.errors import ConfigError

OVERLOAD = "overload"  # the scenario's name in `tiermesh bench --scenario`


def add_overload_options(bench: argparse.ArgumentParser) -> None:
    """The options only `--scenario overload` reads."""
    group = bench.add_argument_group("--scenario overload")
    group.add_argument("--load", type=float, metavar="X", help="offered load: X times capacity")
    group.add_argument(
        "--capacity-s", type=float, default=16.0, metavar="S", help="longest capacity ramp, s"
    )
    group.add_argument(
        "--capacity-ttft-ms",
        type=float,
        default=1000.0,
        metavar="MS",
        help="capacity: the highest rate with TTFT p99 under this, no refusal, no step-down",
    )
    group.add_argument(
        "--echo-max-running",
        type=int,
        metavar="N",
        help="--engine echo: each echo tier's running slots (default 2048: never full)",
    )
    group.add_argument(
        "--echo-max-queued", type=int, metavar="N", help="--engine echo: each echo tier's queue"
    )
    group.add_argument(
        "--unloaded-s", type=float, default=15.0, metavar="S", help="unloaded pass, s"
    )
    group.add_argument(
        "--keys", type=int, default=2, metavar="N", help="own mesh: N API keys over TLS (0: none)"
    )
    group.add_argument(
        "--key-rate-ratio",
        type=float,
        default=1.0,
        metavar="R",
        help="the last key sends R times the first key's rate (those between: geometric)",
    )
    group.add_argument(
        "--priority", choices=tuple(PRIORITY_MIX), help="every overload chat at this priority"
    )
    group.add_argument(
        "--priority-mix",
        metavar="P=S,...",
        help="the overload's priorities by share, e.g. interactive=0.6,batch=0.3,critical=0.1 "
        "(default: " + ",".join(f"{k}={v:g}" for k, v in PRIORITY_MIX.items()) + ")",
    )


def print_report(report: Mapping[str, Any], console: Console) -> None:
    table = Table(
        title=f"overload: {report['load']:g} x capacity {report['capacity_rps']:g} req/s "
        f"for {report['duration_s']:g} s"
    )
    for column in (
        "chats",
        "sent",
        "answered",
        "stepped down",
        "quality vs unloaded",
        "TTFT p50 / p99 ms",
    ):
        table.add_column(column, justify="left" if column == "chats" else "right")
    for row in table_rows(report):
        table.add_row(*row)
    console.print(table)
    refusal = report["refusal_ms"]
    console.print(
        f"answered {report['answered_rps']:g} chats/s; "
        f"refusals: {report['refusals']} (p50 {refusal['p50']} ms, p99 {refusal['p99']} ms); "
        f"step-downs: {report['step_downs'] or 'none'}; unloaded TTFT p99 "
        f"{report['unloaded']['ttft_ms']['p99']} ms"
    )
    for name, target in report["targets"].items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[target["met"]]
        console.print(f"target {name}: {target['value']} vs {target['target']}: {verdict}")
    if report["per_key_share"] is None:
        console.print(f"per_key_share: {report['per_key_share_note']}")
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")


def run_overload_command(
    args: argparse.Namespace, console: Console, mesh: Callable[..., Any]
) -> int:
    """`tiermesh bench --scenario overload`: `mesh(secure=...)` is the context manager of the
    mesh to drive (the bench's own, with TLS and keys given a SecureRun; or --router's)."""
    load = LoadOptions(args.max_tokens, args.timeout)
    try:
        if args.load is None:
            raise BenchError("--scenario overload needs --load X (times the measured capacity)")
        if args.priority and args.priority_mix:
            raise BenchError("--priority and --priority-mix: give one")
        mix = parse_priority_mix(args.priority_mix) if args.priority_mix else None
        with contextlib.ExitStack() as stack:
            keys = None
            if args.router is None and args.keys != 0:  # a running mesh's keys are not ours
                keys = stack.enter_context(bench_keys(args.keys, args.key_rate_ratio))
            target = stack.enter_context(mesh(secure=keys.secure if keys else None))
            report = asyncio.run(
                run_overload(
                    target,
                    load_x=args.load,
                    duration_s=args.duration or 60.0,
                    seed=args.seed,
                    load=load,
                    capacity_s=args.capacity_s,
                    unloaded_s=args.unloaded_s,
                    ttft_bound_ms=args.capacity_ttft_ms,
                    progress=functools.partial(console.print, style="dim"),
                    keys=keys,
                    priority=args.priority,
                    priority_mix=mix,
                )
            )
    except (BenchError, ConfigError, ValueError) as e:
        console.print(f"[red]tiermesh bench:[/red] {e}")
        return 2
    print_report(report, console)
    if args.json:
        print(json.dumps(report))
    return 0
