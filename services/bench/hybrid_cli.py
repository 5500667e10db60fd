"""The `tiermesh bench` (hybrid vs single) and `tiermesh bench sweep` commands: options, live
progress, and the files `--out` writes (report.json, report.md, requests.jsonl, PNG plots).

Knows argparse, rich and files; the runs themselves are services.bench.hybrid_bench's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from services.bench.cost_curve_cli import echo_settings, run_cost_curve_command
from services.bench.costs import DEFAULT_PRICES, load_prices
from services.bench.drift_bench import DRIFT, add_drift_options, run_drift_command
from services.bench.hybrid_bench import (
    BenchError,
    LoadOptions,
    MeshTarget,
    own_mesh,
    run_configurations,
    run_sweep,
)
from services.bench.loadgen import CONFIGURATIONS, LoadCounters, RequestRecord, configuration
from services.bench.openai_cli import run_openai_bench
from services.bench.options import concurrency_levels
from services.bench.overload_cli import OVERLOAD, add_overload_options, run_overload_command
from services.bench.relay_floor import RelayFloorError
from services.bench.report import (
    context_lines,
    markdown_report,
    mix_text,
    print_tables,
    report_tables,
    sweep_table,
)
from services.bench.resources import ServiceHandle
from services.bench.scenarios import PRESETS, SCENARIOS, Scenario, build_scenario
from services.common import env
from services.common.errors import ConfigError
from services.common.tiers import TIER_NAMES
from services.launcher.secure_run import SecureRun
from services.workload import CLASSES


def pairs(values: Sequence[str], keys: Sequence[str], option: str) -> dict[str, str]:
    """KEY=VALUE strings (repeated or comma-separated) as a dict; KEY must be one of keys."""
    parsed = {}
    for value in (v for raw in values for v in raw.split(",") if v):
        key, _, rest = value.partition("=")
        if key not in keys or not rest:
            raise BenchError(f"{option}: expected KEY=VALUE with KEY in {', '.join(keys)}")
        parsed[key] = rest
    return parsed


def configuration_names(value: str) -> list[str]:
    names = [v for v in value.split(",") if v]
    if not names:
        raise argparse.ArgumentTypeError(f"expected names from {', '.join(CONFIGURATIONS)}")
    for name in names:
        try:
            configuration(name)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return names


def plain_configuration_names(value: str) -> list[str]:
    """Configurations of a sweep: those of CONFIGURATIONS (the router keeps its policy)."""
    names = configuration_names(value)
    if any(name not in CONFIGURATIONS for name in names):
        raise argparse.ArgumentTypeError(
            f"a sweep compares {', '.join(CONFIGURATIONS)}; compare policies with "
            "`tiermesh bench --configs hybrid:<policy>,...`"
        )
    return names


def add_common_options(parser: argparse.ArgumentParser, *, sweep: bool) -> None:
    """Options `tiermesh bench` and `tiermesh bench sweep` share (mesh, load, output)."""
    load = parser.add_argument_group("load")
    overload = () if sweep else (OVERLOAD, DRIFT)
    load.add_argument("--scenario", choices=(*SCENARIOS, *overload), default="long-tail")
    load.add_argument("--mix", help="class weights, e.g. simple=0.9,complex=0.1")
    load.add_argument("--seed", type=int, default=0, help="seeds arrivals and requests")
    load.add_argument("--max-tokens", type=int, default=LoadOptions.max_tokens)
    load.add_argument("--timeout", type=float, default=LoadOptions.timeout_s, help="per chat, s")
    load.add_argument(
        "--duration", type=float, help="seconds" + (" per level" if sweep else " per config")
    )
    load.add_argument("--warmup", type=float, help="seconds at the start not measured")
    mesh = parser.add_argument_group("mesh (default: start one as child processes)")
    mesh.add_argument("--router", help="drive the router at ADDR instead of starting a mesh")
    mesh.add_argument("--base-port", type=int, help="own mesh: router on B, tiers on B+10..12")
    mesh.add_argument("--model", action="append", default=[], metavar="TIER=PATH")
    mesh.add_argument("--device", help="own mesh: device of every tier (cpu, cuda, cuda:N)")
    mesh.add_argument(
        "--engine",
        choices=("model", "echo"),
        default="model",
        help="own mesh: echo = tiers with no model (a deterministic answer at a set TTFT and rate)",
    )
    mesh.add_argument("--echo-ttft-ms", type=float, default=10.0, help="echo tiers' TTFT")
    mesh.add_argument(
        "--echo-tokens-per-s", type=float, default=100.0, help="echo tiers' tokens/s per stream"
    )
    mesh.add_argument(
        "--tier", action="append", default=[], metavar="TIER=ADDR", help="--router: tier to watch"
    )
    mesh.add_argument(
        "--pid", action="append", default=[], metavar="NAME=PID", help="--router: process of a "
        "tier or the router, for CPU-seconds and RSS",
    )  # fmt: skip
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="one JSON object as the last line")
    out.add_argument("--out", type=Path, help="write the JSON, Markdown report and plots here")


def register_hybrid(bench: argparse.ArgumentParser, kinds: Any) -> None:
    """Options of `tiermesh bench` itself, and the `sweep` subcommand."""
    add_common_options(bench, sweep=False)
    bench.add_argument("--preset", choices=tuple(PRESETS), default="quick")
    bench.add_argument("--rate", type=float, help="requests/s (burst: the peak)")
    bench.add_argument(
        "--configs",
        type=configuration_names,
        default=list(CONFIGURATIONS),
        help="e.g. single,hybrid; hybrid:<policy> runs hybrid with the router restarted on "
        "that routing policy (own mesh only), e.g. single,hybrid:threshold,hybrid:cost_target; "
        "progressive:<gate> asks each progressive chat for that gate (always, escalate, ...)",
    )
    bench.add_argument("--max-in-flight", type=int, default=LoadOptions.max_in_flight)
    bench.add_argument("--prices", type=Path, default=DEFAULT_PRICES, help="price file (TOML)")
    bench.add_argument(
        "--sweep", type=concurrency_levels, help="also a closed-loop sweep at these clients"
    )
    bench.add_argument(
        "--target",
        choices=("mesh", "openai"),
        default="mesh",
        help="openai: any OpenAI-compatible server at --url, models from --model NAME; with "
        "--router also the gateway's overhead over it",
    )
    bench.add_argument("--url", help="--target openai: base URL, e.g. http://127.0.0.1:8080/v1")
    bench.add_argument(
        "--relay-floor",
        action="store_true",
        help="--target openai --router: at one stream also time a bare HTTP-to-gRPC relay "
        "(services/bench/relay_floor.py) beside the gateway: the least any relay adds here",
    )
    add_overload_options(bench)
    add_drift_options(bench)
    bench.set_defaults(func=cmd_bench)
    sweep = kinds.add_parser(
        "sweep",
        help="closed loop at 1..64 clients, single vs hybrid: throughput by concurrency; "
        "--cost-curve: the router's cost at 1..1000 streams",
    )
    add_common_options(sweep, sweep=True)
    sweep.add_argument(
        "--clients",
        type=concurrency_levels,
        help="levels (default 1,2,4,...,64; with --cost-curve 1,10,100,1000)",
    )
    curve = sweep.add_argument_group("cost curve (own mesh only)")
    curve.add_argument(
        "--cost-curve",
        action="store_true",
        help="per level: chats straight to a tier, then through one router, then through "
        "--routers routers: chats/s, first-token overhead, router CPU per 1,000 chats, RSS, errors",
    )
    curve.add_argument("--cost-tier", choices=TIER_NAMES, default="small", help="tier pinned")
    curve.add_argument(
        "--routers", type=int, choices=range(1, 5), default=2, help="router processes (1-4)"
    )
    curve.add_argument(
        "--ramp",
        type=float,
        metavar="S",
        help="seconds over which the clients' first chats are spread, at most --warmup "
        "(default: the warm-up, or one echo chat's length when that is shorter)",
    )
    sweep.add_argument(
        "--configs", type=plain_configuration_names, default=["single", "hybrid"], help="compared"
    )
    sweep.set_defaults(func=cmd_sweep)


def _mix(args: argparse.Namespace) -> dict[str, float] | None:
    try:
        mix = {k: float(v) for k, v in pairs([args.mix or ""], CLASSES, "--mix").items()}
    except ValueError:
        message = f"--mix: expected weights like simple=0.9,complex=0.1, got {args.mix!r}"
        raise BenchError(message) from None
    return mix or None


def bench_scenario(args: argparse.Namespace) -> Scenario:
    """The scenario of `tiermesh bench`: the named one, its preset, and the options given."""
    return build_scenario(
        args.scenario,
        preset=args.preset,
        rate_rps=args.rate,
        duration_s=args.duration,
        warmup_s=args.warmup,
        mix=_mix(args),
        seed=args.seed,
    )


def sweep_scenario(args: argparse.Namespace, duration_s: float | None) -> Scenario:
    """The scenario of one sweep level: the named scenario's mix, SWEEP_S seconds per level
    (or duration_s) with a quarter of it, at most SWEEP_WARMUP_S, as warm-up."""
    duration = duration_s or SWEEP_S
    warmup = getattr(args, "sweep_warmup", None)
    return build_scenario(
        args.scenario,
        duration_s=duration,
        warmup_s=min(SWEEP_WARMUP_S, duration / 4) if warmup is None else warmup,
        mix=_mix(args),
        seed=args.seed,
    )


SWEEP_S = 10.0
SWEEP_WARMUP_S = 2.0


@contextlib.contextmanager
def mesh_target(
    args: argparse.Namespace, console: Console, secure: SecureRun | None = None
) -> Iterator[MeshTarget]:
    """The mesh to drive: the bench's own (TLS and keys with `secure`), or --router's."""
    if args.router is None:
        models = {k: Path(v) for k, v in pairs(args.model, TIER_NAMES, "--model").items()}
        log_dir = Path(env.run_dir()) / "bench" / "logs"
        with own_mesh(
            base_port=args.base_port,
            models=models,
            device=args.device,
            log_dir=log_dir,
            console=console,
            echo=echo_settings(args),
            secure=secure,
        ) as target:
            yield target
        return
    tiers = pairs(args.tier, TIER_NAMES, "--tier")
    pids = {k: int(v) for k, v in pairs(args.pid, (*TIER_NAMES, "router"), "--pid").items()}
    services = [
        ServiceHandle(name, tiers.get(name), pids.get(name), is_tier=name != "router")
        for name in (*TIER_NAMES, "router")
        if name in tiers or name in pids
    ]
    yield MeshTarget(args.router, services, started_by_bench=False)


def report_console(to_stderr: bool) -> Console:
    """The console for progress and tables: stderr when stdout carries JSON; wide enough for
    the tables when it is not a terminal."""
    console = Console(stderr=to_stderr)
    return console if console.is_terminal else Console(stderr=to_stderr, width=160)


class LiveProgress:
    """A rich progress bar per load run, with its live counts."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<16}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {}

    def tick(self, name: str, elapsed_s: float, total_s: float, c: LoadCounters) -> None:
        if name not in self._tasks:
            self._tasks[name] = self.progress.add_task(name, total=total_s, counts="")
        counts = (
            f"sent {c.sent}  ok {c.completed}  failed {c.failed}  shed {c.shed}  "
            f"in flight {c.in_flight}"
        )
        self.progress.update(self._tasks[name], completed=min(elapsed_s, total_s), counts=counts)


def cmd_bench(args: argparse.Namespace) -> int:
    console = report_console(args.json)
    if args.scenario == OVERLOAD:
        return run_overload_command(args, console, functools.partial(mesh_target, args, console))
    if args.scenario == DRIFT:
        return run_drift_command(args, console, functools.partial(mesh_target, args, console))
    try:
        scenario = bench_scenario(args)
        if args.target == "openai":
            return run_openai_bench(args, scenario, console)
        if getattr(args, "relay_floor", False):
            raise ValueError("--relay-floor is for --target openai --router ADDR")
        prices = load_prices(args.prices)
        load = LoadOptions(args.max_tokens, args.timeout, args.max_in_flight)
        live = LiveProgress(console)
        with mesh_target(args, console) as target, live.progress:
            report, records = asyncio.run(
                run_configurations(target, scenario, args.configs, load, prices, live.tick)
            )
            if args.sweep:
                levels = sweep_scenario(args, None)
                report["sweep"] = asyncio.run(
                    run_sweep(target, levels, args.sweep, ["single", "hybrid"], load, live.tick)
                )
    except (BenchError, ConfigError, ValueError, RelayFloorError) as e:
        console.print(f"[red]tiermesh bench:[/red] {e}")
        return 2
    tables = report_tables(report)
    print_tables(tables, console)
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")
    if args.out:
        written = write_report_files(args.out, report, records, tables)
        console.print(f"wrote {', '.join(str(p) for p in written)}")
    if args.json:
        print(json.dumps(report))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    console = report_console(args.json)
    if args.cost_curve:
        if args.router is not None:
            console.print("[red]tiermesh bench sweep:[/red] --cost-curve starts its own mesh")
            return 2
        return run_cost_curve_command(args, console)
    args.clients = args.clients or [1, 2, 4, 8, 16, 32, 64]
    try:
        args.sweep_warmup = args.warmup
        scenario = sweep_scenario(args, args.duration)
        load = LoadOptions(args.max_tokens, args.timeout)
        live = LiveProgress(console)
        with mesh_target(args, console) as target, live.progress:
            sweep = asyncio.run(
                run_sweep(target, scenario, args.clients, args.configs, load, live.tick)
            )
    except (BenchError, ConfigError, ValueError) as e:
        console.print(f"[red]tiermesh bench sweep:[/red] {e}")
        return 2
    table = sweep_table(sweep)
    print_tables([table], console)
    if args.out:
        from services.bench.plots import throughput_vs_concurrency

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
        plot = throughput_vs_concurrency(sweep, args.out / "throughput_vs_concurrency.png")
        context = [
            f"closed loop, {sweep['duration_s']:g} s per level with {sweep['warmup_s']:g} s "
            f"warm-up, mix {mix_text(sweep['mix'])}, seed {sweep['seed']}, "
            f"max_tokens {sweep['max_tokens']}"
        ]
        page = markdown_report("tiermesh concurrency sweep", context, [table], [plot.name])
        (args.out / "sweep.md").write_text(page)
        console.print(f"wrote {args.out}/sweep.json, sweep.md, {plot.name}")
    if args.json:
        print(json.dumps(sweep))
    return 0


def write_report_files(
    out: Path,
    report: Mapping[str, Any],
    records: Mapping[str, Sequence[RequestRecord]],
    tables: Sequence[Any],
) -> list[Path]:
    """report.json, requests.jsonl (every request with its answer), the plots and report.md."""
    from services.bench import plots

    out.mkdir(parents=True, exist_ok=True)
    scenario = report["scenario"]
    written = [out / "report.json", out / "requests.jsonl"]
    written[0].write_text(json.dumps(report, indent=2) + "\n")
    with written[1].open("w") as handle:
        for name, rows in records.items():
            for record in rows:
                handle.write(json.dumps({"configuration": name, **record.to_json()}) + "\n")
    window = (scenario["warmup_s"], scenario["duration_s"])
    pngs = [
        plots.latency_cdfs(records, *window, out / "latency_cdf.png"),
        plots.cost_vs_quality(report, out / "cost_vs_quality.png"),
    ]
    if report.get("sweep"):
        pngs.append(
            plots.throughput_vs_concurrency(report["sweep"], out / "throughput_vs_concurrency.png")
        )
    page = markdown_report(
        "tiermesh benchmark: hybrid vs single",
        context_lines(report),
        tables,
        [p.name for p in pngs],
    )
    (out / "report.md").write_text(page)
    return [*written, *pngs, out / "report.md"]
