"""Output of `tiermesh bench --target openai`: runs services.bench.openai_target and prints its
tables (and the JSON with --json, report files with --out). Knows argparse, rich and files."""

from __future__ import annotations

import argparse
import asyncio
import json
from contextlib import nullcontext
from typing import Any

from rich.console import Console
from rich.table import Table

from services.bench.openai_target import gateway_overhead, run_openai
from services.bench.relay_floor import relay_floor
from services.bench.scenarios import Scenario

OVERHEAD_S = 10.0  # closed-loop seconds per side and stream count


def openai_models(args: argparse.Namespace) -> list[str]:
    """With --target openai, --model names the served models (at least one)."""
    models = list(args.model)
    if not models or any("=" in m for m in models):
        raise ValueError(
            "--target openai: give --model NAME (the served model, e.g. tiermesh-small)"
        )
    return models


def run_openai_bench(args: argparse.Namespace, scenario: Scenario, console: Console) -> int:
    if not args.url:
        raise ValueError("--target openai needs --url (the base URL ending in /v1)")
    if args.relay_floor and not args.router:
        raise ValueError("--relay-floor needs --router (the router the gateway calls)")
    url = args.url.rstrip("/")
    models = openai_models(args)
    with console.status(f"open loop against {url}: {', '.join(models)}"):
        report = asyncio.run(
            run_openai(url, models, scenario, args.max_tokens, args.timeout, args.max_in_flight)
        )
    if args.router:
        with (
            console.status(f"gateway overhead over the router at {args.router}"),
            relay_floor(args.router) if args.relay_floor else nullcontext() as floor_url,
        ):
            report["gateway_overhead"] = asyncio.run(
                gateway_overhead(
                    url, args.router, models[0], args.max_tokens, args.timeout,
                    args.duration or OVERHEAD_S, args.seed, floor_url=floor_url,
                )
            )  # fmt: skip
    console.print(latency_table(report))
    if "gateway_overhead" in report:
        console.print(overhead_table(report["gateway_overhead"]))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "openai.json").write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.out / 'openai.json'}")
    if args.json:
        print(json.dumps(report))
    return 0


def _q(values: dict[str, Any]) -> str:
    return " / ".join(
        "-" if values[q] is None else f"{values[q]:.1f}" for q in ("p50", "p90", "p99")
    )


def latency_table(report: dict[str, Any]) -> Table:
    table = Table(title=f"{report['url']}: ms p50 / p90 / p99")
    for column in ("model", "done", "errors", "TTFT", "ITL", "TPOT", "E2E", "req/s", "tok/s"):
        table.add_column(column)
    for model, m in report["models"].items():
        table.add_row(
            model,
            str(m["requests"]["completed"]),
            json.dumps(m["requests"]["errors"]) if m["requests"]["errors"] else "0",
            _q(m["ttft_ms"]),
            _q(m["itl_ms"]),
            _q(m["tpot_ms"]),
            _q(m["e2e_ms"]),
            f"{m['throughput_rps']:.2f}",
            f"{m['output_tokens_per_s']:.0f}",
        )
    return table


def overhead_table(overhead: dict[str, Any]) -> Table:
    table = Table(title=f"gateway over direct gRPC ({overhead['model']}, closed loop)")
    for column in (
        "streams",
        "TTFT p50 grpc/gw",
        "added p50",
        "added p99",
        "tok/s grpc/gw",
        "ratio",
    ):
        table.add_column(column)
    for level in overhead["levels"]:
        g, h = level["grpc"], level["gateway"]
        table.add_row(
            str(level["streams"]),
            f"{g['ttft_ms']['p50']} / {h['ttft_ms']['p50']}",
            f"{level['ttft_added_ms']['p50']}",
            f"{level['ttft_added_ms']['p99']}",
            f"{g['output_tokens_per_s']:.0f} / {h['output_tokens_per_s']:.0f}",
            f"{level['tokens_per_s_ratio']}",
        )
        if "relay_floor" in level:
            f = level["relay_floor"]
            table.add_row(
                "  bare relay",
                f"{g['ttft_ms']['p50']} / {f['ttft_ms']['p50']}",
                f"{level['floor_ttft_added_ms']['p50']}",
                f"{level['floor_ttft_added_ms']['p99']}",
                f"{g['output_tokens_per_s']:.0f} / {f['output_tokens_per_s']:.0f}",
                "",
            )
    return table
