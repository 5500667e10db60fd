"""PNG plots of a benchmark: latency CDFs per configuration, throughput against concurrency, cost
against quality, and the router's cost curve (CPU per chat and overhead against concurrency).
Headless: figures are drawn with matplotlib's Agg canvas, never a window.

Knows the report's JSON shape and request records; nothing of how they were measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.common.extras import require_extra

require_extra("matplotlib", "plotting a benchmark")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from services.bench.loadgen import RequestRecord  # noqa: E402

COLOURS = {"single": "#c0392b", "hybrid": "#2471a3", "progressive": "#229954"}


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    figure.tight_layout()
    figure.savefig(str(path), dpi=110)
    return path


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def latency_cdfs(
    records: Mapping[str, Sequence[RequestRecord]], warmup_s: float, end_s: float, path: Path
) -> Path:
    """Two panels: TTFT and time to the final answer (ms, log scale), one line per
    configuration, over completed requests that arrived after the warm-up."""
    figure = Figure(figsize=(10, 4))
    panels = (("ttft_s", "time to first token"), ("final_s", "time to final answer"))
    for index, (attribute, title) in enumerate(panels):
        axes = figure.add_subplot(1, 2, index + 1)
        for name, rows in records.items():
            values = [
                getattr(r, attribute) * 1000
                for r in rows
                if r.ok and warmup_s <= r.scheduled_at_s < end_s and getattr(r, attribute)
            ]
            if values:
                xs, ys = _cdf(values)
                axes.step(xs, ys, where="post", label=name, color=COLOURS.get(name))
        axes.set_xscale("log")
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_xlabel("ms (log)")
        axes.set_ylabel("share of requests")
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend()
    return _save(figure, path)


def throughput_vs_concurrency(sweep: Mapping[str, Any], path: Path) -> Path:
    """Completed requests/s against closed-loop clients, one line per configuration."""
    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot(1, 1, 1)
    levels = [row["clients"] for row in sweep["rows"]]
    for name in sweep["configurations"]:
        values = [row[name]["throughput_rps"] for row in sweep["rows"]]
        axes.plot(levels, values, marker="o", label=name, color=COLOURS.get(name))
    axes.set_xscale("log", base=2)
    axes.set_xticks(levels, [str(level) for level in levels])
    axes.set_xlabel("concurrent clients")
    axes.set_ylabel("completed requests / s")
    axes.set_title("throughput by concurrency")
    axes.grid(True, alpha=0.3)
    axes.legend()
    return _save(figure, path)


def cost_vs_quality(report: Mapping[str, Any], path: Path) -> Path:
    """Cost per 1M output tokens (one panel per price profile) against accuracy."""
    profiles = list(report["prices"])
    figure = Figure(figsize=(5 * max(1, len(profiles)), 4))
    for index, profile in enumerate(profiles):
        axes = figure.add_subplot(1, max(1, len(profiles)), index + 1)
        for position, (name, config) in enumerate(report["configurations"].items()):
            cost = config["cost_per_1m_output_tokens"].get(profile)
            quality = config["quality"]["accuracy"]
            if cost is None or quality is None:
                continue
            axes.scatter([cost], [quality], s=60, label=name, color=COLOURS.get(name))
            offset = (6, 6 + 12 * position)  # staggered so equal points stay readable
            axes.annotate(name, (cost, quality), textcoords="offset points", xytext=offset)
        axes.set_xlim(left=0)
        axes.set_xlabel(f"$ per 1M output tokens ({profile})")
        axes.set_ylabel("accuracy")
        axes.set_ylim(-0.02, 1.02)
        axes.set_title(f"cost vs quality ({profile})")
        axes.grid(True, alpha=0.3)
    return _save(figure, path)


def cost_curve(report: Mapping[str, Any], path: Path) -> Path:
    """The router's cost curve: CPU milliseconds per chat (left) and first-token overhead p50
    and p99 over the direct tier call (right) against concurrent streams, one colour per run
    (one router, several)."""
    figure = Figure(figsize=(10, 4))
    levels = [row["clients"] for row in report["rows"]]
    runs = [name for name in report["rows"][0] if name not in ("clients", "direct")]
    colours = ("#2471a3", "#229954", "#c0392b")
    cpu_axes = figure.add_subplot(1, 2, 1)
    latency_axes = figure.add_subplot(1, 2, 2)
    for index, name in enumerate(runs):
        colour = colours[index % len(colours)]
        cpu = [row[name]["router_cpu_s_per_1000_chats"] for row in report["rows"]]
        cpu_axes.plot(levels, cpu, marker="o", color=colour, label=name)
        for quantile, style in (("p50", "-"), ("p99", "--")):
            values = [row[name]["overhead_ms"][quantile] for row in report["rows"]]
            latency_axes.plot(
                levels, values, style, marker="o", color=colour, label=f"{name} {quantile}"
            )
    for axes in (cpu_axes, latency_axes):
        axes.set_xscale("log")
        axes.set_xticks(levels, [str(level) for level in levels])
        axes.xaxis.set_minor_formatter(NullFormatter())
        axes.set_xlabel("concurrent streams (closed loop)")
        axes.grid(True, alpha=0.3)
        axes.legend()
    cpu_axes.set_ylabel("router CPU ms per chat (= s per 1,000 chats)")
    cpu_axes.set_title("router CPU per chat")
    latency_axes.set_yscale("symlog", linthresh=1.0)  # overheads span 1 ms to seconds
    latency_axes.set_ylabel("ms over the direct tier call (symlog)")
    latency_axes.set_title("first-token overhead")
    return _save(figure, path)
