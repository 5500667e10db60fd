"""`tiermesh bench ...`: benchmarks that compare configurations side by side in one run.

tiermesh bench [--scenario S] [--json] [--out DIR]   single vs hybrid vs progressive under load
tiermesh bench sweep [--clients 1,2,...,64]          throughput by concurrency, single vs hybrid
tiermesh bench engine [--dtype D] [--json]           continuous batching vs sequential generate
tiermesh bench engine --engine torch,vllm            engines side by side (vLLM from .venv-vllm)
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from services.bench.options import concurrency_levels
from services.common.config import TierConfig
from services.common.config_loading import load_config

SERVICES = Path(__file__).resolve().parent.parent


def register(commands: Any) -> None:
    from services.bench.hybrid_cli import register_hybrid

    bench = commands.add_parser(
        "bench",
        help="hybrid vs single-model benchmark (no KIND); sweep; engine batching",
        description="Without KIND: single, hybrid and progressive one after the other under the "
        "same seeded load, with latency, throughput, quality, cost and memory per configuration.",
    )
    kinds = bench.add_subparsers(dest="bench_kind", metavar="KIND", required=False)
    register_hybrid(bench, kinds)
    engine = kinds.add_parser(
        "engine", help="our continuous batching vs sequential HF generate, side by side"
    )
    engine.add_argument("--model", type=Path, help="model folder (default: the large tier's)")
    engine.add_argument(
        "--concurrency",
        type=concurrency_levels,
        default=[1, 4, 16, 64],
        help="levels, e.g. 1,4,16,64",
    )
    engine.add_argument("--max-tokens", type=int, default=32, help="tokens per stream")
    engine.add_argument(
        "--no-transformers-batching", action="store_true", help="skip transformers generate_batch"
    )
    engine.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="weights' dtype (default: the folder's import dtype, else float32)",
    )
    engine.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="timed bursts per level for our engine, after one untimed warm-up burst (>= 1)",
    )
    engine.add_argument(
        "--engine",
        dest="engines",
        help="engines side by side, each in its own process: a comma-separated list of torch, "
        "vllm (tiermesh's vllm engine), vllm-tier (a tier on vLLM over gRPC) and vllm-server "
        "(vLLM's own OpenAI server); default: torch in this process against transformers",
    )
    engine.add_argument(
        "--seed", type=int, default=0, help="with --engine: the order prompts are drawn in"
    )
    engine.add_argument("--json", action="store_true", help="one JSON object as the last line")
    engine.set_defaults(func=cmd_engine)


def cmd_engine(args: argparse.Namespace) -> int:
    from services.bench.engine_bench import run_engine_bench

    console = Console(stderr=args.json)
    model = args.model
    if model is None:
        model = load_config(TierConfig, SERVICES / "tier_large" / "config.toml").model_path
    if not (model / "config.json").is_file():
        console.print(f"[red]bench engine:[/red] no model at {model} (run `make models`)")
        return 2
    if args.rounds < 1:
        console.print(f"[red]bench engine:[/red] --rounds must be >= 1, got {args.rounds}")
        return 2
    if args.engines is not None:
        return cmd_engines(args, model, console)
    with console.status("benchmarking…") as status:
        report = run_engine_bench(
            model,
            args.concurrency,
            args.max_tokens,
            with_transformers_batching=not args.no_transformers_batching,
            progress=lambda text: status.update(text),
            dtype=args.dtype,
            rounds=args.rounds,
        )
    print_engine_report(report, console)
    if args.json:
        print(json.dumps(report))
    return 0


def cmd_engines(args: argparse.Namespace, model: Path, console: Console) -> int:
    """`bench engine --engine ...`: the engines side by side, progress on stderr."""
    from services.bench.engine_plan import VLLM_ENGINES, parse_engines
    from services.bench.engine_servers import ChildFailed
    from services.bench.engine_side_by_side import run_engines_bench
    from services.common.errors import ConfigError
    from services.launcher.vllm_tiers import CHECKOUT, require_python, vllm_python

    try:
        engines = parse_engines(args.engines)
    except ValueError as e:
        console.print(f"[red]bench engine:[/red] --engine: {e}")
        return 2
    python = vllm_python(TierConfig(name="large", model_path=model), os.environ, CHECKOUT)
    if VLLM_ENGINES & set(engines):
        try:
            require_python(python)
        except ConfigError as e:
            console.print(f"[red]bench engine:[/red] {e}")
            return 2
    progress = Console(stderr=True)
    try:
        report = run_engines_bench(
            model,
            engines,
            args.concurrency,
            args.max_tokens,
            python,
            rounds=args.rounds,
            seed=args.seed,
            dtype=args.dtype,
            progress=lambda text: progress.log(text),
        )
    except ChildFailed as e:
        console.print(f"[red]bench engine:[/red] {e}")
        return 1
    print_engines_report(report, console)
    if args.json:
        print(json.dumps(report))
    return 0


ENGINE_COLUMNS = ("engine", "streams", "tokens/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT ms")


def _engine_table(title: str, more: tuple[str, ...]) -> Table:
    """A table of engine rows: ENGINE_COLUMNS, then `more`."""
    table = Table(title=title)
    for column in (*ENGINE_COLUMNS, *more):
        table.add_column(column, justify="right" if column != "engine" else "left")
    return table


def _engine_cells(row: dict[str, Any]) -> list[str]:
    """A row's cells of ENGINE_COLUMNS."""
    return [
        row["engine"],
        str(row["concurrency"]),
        f"{row['tokens_per_s']:.0f}",
        f"{row['ttft_ms_p50']:.1f}",
        f"{row['ttft_ms_p99']:.1f}",
        f"{row['tpot_ms']:.2f}",
    ]


def print_engines_report(report: dict[str, Any], console: Console) -> None:
    """The side-by-side table: one row per engine and level, then the target ratios."""
    title = f"engines side by side: {report['model']} ({report['params'] / 1e6:.1f}M)"
    table = _engine_table(title, ("= generate", "RSS MB"))
    for row in report["rows"]:
        rss = row["rss_mb"]
        matching = f"{row['streams_matching_generate']}/{row['concurrency']}"
        table.add_row(*_engine_cells(row), matching, "-" if rss is None else f"{rss:.0f}")
    console.print(table)
    for level in report["levels"]:
        for key, text in (
            ("torch_vs_vllm_tokens_per_s", "torch / vllm tokens/s"),
            ("torch_vs_vllm_ttft_p99", "torch / vllm TTFT p99"),
            ("tier_vs_vllm_server_tokens_per_s", "vllm-tier / vllm-server tokens/s"),
        ):
            ratio = report.get(f"{key}_at_{level}")
            if ratio is not None:
                console.print(f"{text} at {level} streams: {ratio:.2f}x")


def print_engine_report(report: dict[str, Any], console: Console) -> None:
    title = f"engine benchmark: {report['model']} ({report['params'] / 1e6:.1f}M)"
    table = _engine_table(title, ("= generate",))
    for row in report["rows"]:
        table.add_row(*_engine_cells(row), "yes" if row["matches_generate"] else "NO")
    console.print(table)
    for level in report["levels"]:
        ratio = report.get(f"ratio_vs_generate_at_{level}")
        if ratio is not None:
            console.print(f"tiermesh / sequential generate at {level} streams: {ratio:.2f}x")
    bw = report["bandwidth"]
    console.print(
        f"batch 1: decode {bw['batch1_decode_tokens_per_s']} tok/s = "
        f"{bw['decode_fraction_of_bound']:.0%}, whole requests (prefill included) "
        f"{bw['batch1_tokens_per_s']} tok/s = {bw['fraction_of_bound']:.0%} of the "
        f"memory-bandwidth bound ({bw['bound_tokens_per_s']} tok/s at "
        f"{bw['copy_bandwidth_gb_s']} GB/s copy, {bw['weights_bytes'] / 1e6:.1f} MB weights)"
    )
    for name, reason in report["skipped"].items():
        console.print(f"[yellow]{name} did not run:[/yellow] {reason}")
    console.print(
        "[dim]hf_generate_batch returns whole answers: its TTFT column is its total time[/dim]"
    )
