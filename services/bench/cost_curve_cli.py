"""`tiermesh bench sweep --cost-curve`: starts its own mesh (echo tiers or the models, one or
more router processes), runs services.bench.cost_curve over it, prints the table and writes
cost_curve.json, cost_curve.md and cost_curve.png with `--out`.

Knows argparse, rich, files and the launcher's functions; the runs are cost_curve.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from services.bench.cost_curve import CostMesh, CostOptions, Process, run_cost_curve
from services.bench.report import TableSpec, markdown_report, print_tables
from services.bench.scenarios import RequestSequence
from services.common import env
from services.common.child_process import Child
from services.common.errors import ConfigError
from services.common.ports import free_port
from services.common.tiers import TIER_NAMES
from services.launcher.echo_tiers import EchoSettings
from services.launcher.local_mesh import free_base_port, plan_children, started
from services.workload import CLASSES

DEFAULT_LEVELS = [1, 10, 100, 1000]


class CostCurveError(Exception):
    """The cost curve could not run; the message says why."""


def echo_settings(args: argparse.Namespace) -> EchoSettings | None:
    """The echo tiers asked for by `--engine echo`, else None (the tiers' models)."""
    if getattr(args, "engine", "model") != "echo":
        return None
    settings = EchoSettings(ttft_ms=args.echo_ttft_ms, tokens_per_s=args.echo_tokens_per_s)
    # `bench --scenario overload`: slots and queue small enough for the echo mesh to fill
    running = getattr(args, "echo_max_running", None) or settings.max_running
    queued = getattr(args, "echo_max_queued", None) or settings.max_queued
    return replace(settings, max_running=running, max_queued=queued)


def ramp_seconds(args: argparse.Namespace, warmup_s: float, echo: EchoSettings | None) -> float:
    """How long the clients' first chats are spread over: `--ramp`, else the warm-up, or one
    echo chat's length when that is shorter (echo chats all last as long, so clients spread
    over more than one chat would meet again in step)."""
    if args.ramp is not None:
        if not 0 <= args.ramp <= warmup_s:
            raise CostCurveError(
                f"--ramp must be in [0, --warmup = {warmup_s:g}], got {args.ramp:g}"
            )
        return float(args.ramp)
    if echo is not None and echo.tokens_per_s > 0:
        chat_s = echo.ttft_ms / 1000 + (args.max_tokens - 1) / echo.tokens_per_s
        return float(min(warmup_s, chat_s))
    return warmup_s


def _another_router(router: Child, number: int, log_dir: Path) -> Child:
    """A copy of the planned router child on a free port, metrics off."""
    command = list(router.command)
    port = free_port()
    for flag, value in (("--port", str(port)), ("--metrics-port", "0")):
        if flag in command:
            command[command.index(flag) + 1] = value
        else:
            command += [flag, value]
    name = f"router-{number}"
    return Child(name, f"127.0.0.1:{port}", command, log_dir / f"{name}.log")


@contextlib.contextmanager
def cost_mesh(
    args: argparse.Namespace, tier: str, routers: int, max_inflight: int, console: Console
) -> Iterator[CostMesh]:
    """The three tiers and `routers` router processes, stopped on exit."""
    log_dir = Path(env.run_dir()) / "bench" / "logs"
    models = {}
    for value in args.model:
        name, _, path = value.partition("=")
        if name not in TIER_NAMES or not path:
            raise CostCurveError(f"--model: expected TIER=PATH, got {value!r}")
        models[name] = Path(path)
    try:
        base = args.base_port or free_base_port()
        planned = plan_children(base, models, args.device, log_dir, echo=echo_settings(args))
    except (ConfigError, OSError) as e:
        raise CostCurveError(str(e)) from None
    children = [child for child in planned if child.name != "gateway"]
    router = children[-1]
    router.command += ["--max-inflight", str(max_inflight)]
    children += [_another_router(router, n, log_dir) for n in range(2, routers + 1)]
    with started(children, console, CostCurveError(f"the mesh did not start; logs in {log_dir}")):
        processes = {
            c.name: Process(c.name, c.address, c.process.pid if c.process else None)
            for c in children
        }
        routers_up = [p for name, p in processes.items() if name.startswith("router")]
        yield CostMesh(tier, processes[tier], routers_up)


def cost_curve_table(report: Mapping[str, Any]) -> TableSpec:
    """Per level: the direct tier's TTFT, then each router run's chats/s, first-token overhead,
    CPU per 1,000 chats, RSS and errors."""
    runs = [name for name in report["rows"][0] if name not in ("clients", "direct")]
    columns = ["clients", "direct TTFT p50/p99 ms"]
    for name in runs:
        columns += [
            f"{name} chats/s",
            f"{name} overhead p50/p99 ms",
            f"{name} CPU s/1k chats",
            f"{name} RSS MiB",
            f"{name} errors",
        ]
    rows = []
    for row in report["rows"]:
        direct = row["direct"]["ttft_ms"]
        cells = [str(row["clients"]), f"{_n(direct['p50'])} / {_n(direct['p99'])}"]
        for name in runs:
            run = row[name]
            rss = [v for v in run["router_rss_bytes"].values() if v is not None]
            errors = run["errors"] or {}
            cells += [
                _n(run["chats_per_s"]),
                f"{_n(run['overhead_ms']['p50'])} / {_n(run['overhead_ms']['p99'])}",
                _n(run["router_cpu_s_per_1000_chats"]),
                _n(sum(rss) / 2**20) if rss else "-",
                ", ".join(f"{k} {v}" for k, v in errors.items()) or "0",
            ]
        rows.append(tuple(cells))
    title = f"router cost curve (closed loop, pinned to {report['tier']})"
    return TableSpec(title, tuple(columns), rows)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def run_cost_curve_command(args: argparse.Namespace, console: Console) -> int:
    levels = args.clients or DEFAULT_LEVELS
    prompts = tuple(
        RequestSequence(dict.fromkeys(CLASSES, 1.0), args.seed)[i].prompt for i in range(64)
    )
    warmup_s = 2.0 if args.warmup is None else args.warmup
    echo = echo_settings(args)
    try:
        options = CostOptions(
            levels=levels,
            duration_s=args.duration or 10.0,
            warmup_s=warmup_s,
            max_tokens=args.max_tokens,
            timeout_s=args.timeout,
            prompts=prompts,
            ramp_s=ramp_seconds(args, warmup_s, echo),
        )
        max_inflight = 2 * max(levels) + 64
        with cost_mesh(args, args.cost_tier, args.routers, max_inflight, console) as mesh:
            report = asyncio.run(
                run_cost_curve(mesh, options, lambda text: console.print(f"running {text}"))
            )
    except (CostCurveError, ValueError) as e:
        console.print(f"[red]tiermesh bench sweep --cost-curve:[/red] {e}")
        return 2
    report["engine"] = args.engine
    report["echo"] = (
        None if echo is None else {"ttft_ms": echo.ttft_ms, "tokens_per_s": echo.tokens_per_s}
    )
    table = cost_curve_table(report)
    print_tables([table], console)
    if args.out:
        write_cost_curve(args.out, report, table)
        console.print(f"wrote {args.out}/cost_curve.json, cost_curve.md, cost_curve.png")
    if args.json:
        print(json.dumps(report))
    return 0


def write_cost_curve(out: Path, report: Mapping[str, Any], table: TableSpec) -> None:
    from services.bench.plots import cost_curve

    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_curve.json").write_text(json.dumps(report, indent=2) + "\n")
    plot = cost_curve(report, out / "cost_curve.png")
    engine = report["engine"] if report["echo"] is None else f"echo {report['echo']}"
    context = [
        f"closed loop, {report['duration_s']:g} s per run with {report['warmup_s']:g} s "
        f"warm-up (the clients' first chats spread over its first {report['ramp_s']:g} s), "
        f"max_tokens {report['max_tokens']}, tiers: {engine}",
        "overhead: router TTFT minus the direct tier's TTFT at the same level, same run",
    ]
    (out / "cost_curve.md").write_text(
        markdown_report("tiermesh router cost curve", context, [table], [plot.name])
    )
