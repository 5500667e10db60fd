"""Renders a benchmark report object as tables (rich on a terminal, Markdown in a file): latency
by request class with the difference against single in %, the configurations side by side,
memory per tier, the ratios against the targets, and throughput by concurrency with the gain.

Knows the report's JSON shape; nothing of how the numbers were measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from services.bench.metrics import change_pct

MIB = 1024 * 1024
# hybrid over single, from the seed's claims: (ratio key, bound, "<=" or ">=")
TARGETS = (
    ("simple_p99_ttft", 0.25, "<="),
    ("throughput", 2.5, ">="),
    ("cost", 0.35, "<="),
    ("quality", 0.97, ">="),
)


@dataclass(frozen=True)
class TableSpec:
    title: str
    columns: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _interval(bounds: Sequence[float] | None, digits: int = 3) -> str:
    """` [lo-hi]` of a `*_ci95` field, or nothing where there is none."""
    return "" if not bounds else f" [{_num(bounds[0], digits)}-{_num(bounds[1], digits)}]"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def latency_table(report: Mapping[str, Any]) -> TableSpec:
    """The seed's latency-by-class table: each configuration against single, in ms and %."""
    configs = report["configurations"]
    names = list(configs)
    base = configs.get("single")
    columns = ["class", "metric"]
    for name in names:
        columns.append(f"{name} ms")
        if base is not None and name != "single":
            columns.append(f"{name} vs single")
    rows = []
    classes = [
        c for c in ("simple", "medium", "complex", "overall") if c in configs[names[0]]["latency"]
    ]
    metrics = (
        ("ttft_ms", "p50", "TTFT P50"),
        ("ttft_ms", "p99", "TTFT P99"),
        ("e2e_ms", "p50", "final P50"),
        ("e2e_ms", "p99", "final P99"),
    )
    for request_class in classes:
        for key, quantile, label in metrics:
            row = [request_class, label]
            base_value = None if base is None else _lat(base, request_class, key, quantile)
            for name in names:
                value = _lat(configs[name], request_class, key, quantile)
                row.append(_num(value))
                if base is not None and name != "single":
                    row.append(_pct(change_pct(value, base_value)))
            rows.append(tuple(row))
    return TableSpec("latency by request class (client-side)", tuple(columns), rows)


def _lat(config: Mapping[str, Any], request_class: str, key: str, quantile: str) -> float | None:
    entry = config["latency"].get(request_class)
    return None if entry is None else entry[key][quantile]


def summary_table(report: Mapping[str, Any]) -> TableSpec:
    columns = (
        "configuration",
        "completed",
        "failed",
        "shed",
        "req/s",
        "out tok/s",
        "accuracy",
        "CPU-s",
        "$/1M tok (cpu)",
        "$/1M tok (a100)",
        "answered by",
    )
    rows: list[tuple[str, ...]] = []
    for name, config in report["configurations"].items():
        requests, cost = config["requests"], config["cost_per_1m_output_tokens"]
        answered = ", ".join(f"{tier} {n}" for tier, n in config["answered_by"].items())
        rows.append(
            (
                name,
                str(requests["completed"]),
                str(requests["failed"]),
                str(requests["shed"]),
                _num(config["throughput_rps"], 2),
                _num(config["output_tokens_per_s"]),
                _num(config["quality"]["accuracy"], 3)
                + _interval(config["quality"].get("accuracy_ci95")),
                _num(sum(config["cpu_seconds"].values()), 1) if config["cpu_seconds"] else "-",
                _num(cost.get("cpu"), 4),
                _num(cost.get("a100"), 4),
                answered,
            )
        )
    return TableSpec("configurations (measured window)", columns, rows)


def memory_table(report: Mapping[str, Any]) -> TableSpec:
    columns = (
        "configuration",
        "service",
        "RSS peak MiB",
        "KV used peak / capacity (tokens)",
        "KV pool MiB",
        "weights MiB",
    )
    rows: list[tuple[str, ...]] = []
    for name, config in report["configurations"].items():
        for service, memory in config["memory"].items():
            rss = memory.get("rss_peak_bytes")
            kv_cap = memory.get("kv_pool_capacity_tokens")
            kv = "-" if kv_cap is None else f"{memory.get('kv_used_peak_tokens')} / {kv_cap}"
            rows.append(
                (
                    str(name),
                    str(service),
                    _num(None if rss is None else rss / MIB),
                    kv,
                    _num(_mib(memory.get("kv_pool_bytes"))),
                    _num(_mib(memory.get("weights_bytes"))),
                )
            )
    return TableSpec("memory per service (peak during each configuration)", columns, rows)


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def ratio_table(report: Mapping[str, Any]) -> TableSpec:
    ratios = report["ratios"]
    columns = ("ratio (over single)", *ratios, "target for hybrid")
    rows = []
    for key, bound, sense in TARGETS:
        row = [key]
        for name, values in ratios.items():
            value = values.get(key)
            mark = ""
            if name == "hybrid_vs_single" and value is not None:
                judged = value
                strict = values.get("quality_all")
                if key == "quality" and strict is not None:  # unanswered counted wrong too
                    judged = min(value, strict)
                met = judged <= bound if sense == "<=" else judged >= bound
                mark = " ✓" if met else " ✗"
            interval = _interval(values.get(f"{key}_ci95"))
            row.append(f"{_num(value, 3)}x{interval}{mark}" if value is not None else "-")
        row.append(f"{sense} {bound}x")
        rows.append(tuple(row))
    alls = [values.get("quality_all") for values in ratios.values()]
    if any(value is not None for value in alls):
        cells = [
            f"{_num(value, 3)}x{_interval(values.get('quality_all_ci95'))}"
            if value is not None
            else "-"
            for value, values in zip(alls, ratios.values(), strict=True)
        ]
        rows.append(("quality_all (unanswered counted wrong)", *cells, "quality's check too"))
    return TableSpec("ratios against single (quality: 95% bootstrap interval)", columns, rows)


def sweep_table(sweep: Mapping[str, Any]) -> TableSpec:
    """The seed's throughput-by-concurrency table: req/s per configuration and the gain."""
    names = sweep["configurations"]
    others = [n for n in names if n != "single"]
    columns = ("clients", *(f"{n} req/s" for n in names), *(f"{n} gain" for n in others))
    columns += tuple(f"{n} TTFT P99 ms" for n in names)
    rows = []
    for row in sweep["rows"]:
        gains = row.get("gain_pct", {})
        rows.append(
            (
                str(row["clients"]),
                *(_num(row[n]["throughput_rps"], 2) for n in names),
                *(_pct(gains.get(n)) for n in others),
                *(_num(row[n]["latency"]["ttft_ms"]["p99"]) for n in names),
            )
        )
    return TableSpec("throughput by concurrency (closed loop)", columns, rows)


def report_tables(report: Mapping[str, Any]) -> list[TableSpec]:
    tables = [latency_table(report), summary_table(report), memory_table(report)]
    if report["ratios"]:
        tables.append(ratio_table(report))
    if report.get("sweep"):
        tables.append(sweep_table(report["sweep"]))
    return tables


def print_tables(tables: Sequence[TableSpec], console: Console) -> None:
    for spec in tables:
        table = Table(title=spec.title)
        for index, column in enumerate(spec.columns):
            table.add_column(column, justify="left" if index == 0 else "right")
        for row in spec.rows:
            table.add_row(*row)
        console.print(table)


def markdown_table(spec: TableSpec) -> str:
    lines = [f"### {spec.title}", "", "| " + " | ".join(spec.columns) + " |"]
    lines.append("| " + " | ".join("---" for _ in spec.columns) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in spec.rows]
    return "\n".join(lines) + "\n"


def markdown_report(
    title: str, context: Sequence[str], tables: Sequence[TableSpec], plots: Sequence[str]
) -> str:
    """A Markdown page: a title, context lines as a list, every table, then the plots."""
    parts = [f"# {title}", "", *(f"- {line}" for line in context), ""]
    parts += [markdown_table(spec) for spec in tables]
    parts += [f"![{name}]({name})\n" for name in plots]
    return "\n".join(parts)


def mix_text(mix: Mapping[str, float]) -> str:
    return ", ".join(f"{c} {w:.0%}" for c, w in mix.items() if w)


def context_lines(report: Mapping[str, Any]) -> list[str]:
    """What a reader needs to weigh the numbers: the offered load, the mesh, how cost is made."""
    scenario = report["scenario"]
    mix = mix_text(scenario["mix"])
    lines = [
        f"scenario `{scenario['name']}` ({scenario['shape']}, {scenario['loop']} loop): "
        f"{scenario['rate_rps']} req/s{' peak' if scenario['shape'] == 'waves' else ''}, "
        f"{scenario['duration_s']:g} s with {scenario['warmup_s']:g} s warm-up, mix {mix}, "
        f"seed {scenario['seed']}, {scenario['requests_scheduled']} arrivals "
        f"(schedule {scenario['schedule_digest']}, the same for every configuration)",
        f"max_tokens {scenario['max_tokens']}, deadline {scenario['timeout_s']:g} s, "
        f"client cap {scenario['max_in_flight']} in flight (arrivals over it are shed)",
        f"router {report['mesh']['router']} "
        f"({'started by the bench' if report['mesh']['started_by_bench'] else 'running mesh'}); "
        f"{report['machine']['cpus']} CPUs, load average {report['machine']['loadavg_1m_at_end']} "
        "at the end",
        f"CPU time: {report['cpu_time_source']}; cost = CPU-seconds x price per hour "
        "(services/bench/prices.toml)",
        "latency is client-side, over requests that arrived after the warm-up; for progressive "
        "TTFT is the first draft's and `final` the final revision's",
        *(f"**warning**: {warning}" for warning in report.get("warnings", [])),
    ]
    return lines
