"""`tiermesh bench --scenario overload --load X`: how the mesh behaves past its capacity.

Three phases against one mesh, all on the same seeded request sequence (the workload's traffic
mix):

1. capacity: an open-loop ramp of routed interactive chats in RAMP_STEP_S steps from
   RAMP_START_RPS, doubling until a step is not served (a refusal, a step-down or TTFT p99 over
   the bound), then halving the gap (geometric middle) for the steps --capacity-s leaves; the
   capacity is the highest rate served, at most the rate the mesh answered at in a step it did
   not serve (the tiers' queues absorb a short step);
2. unloaded: a closed loop of UNLOADED_CLIENTS routed interactive chats for a few seconds over
   every stride-th request of the sequence, the stride spreading them over the whole overload
   run: the answers and TTFT the loaded chats are compared with (the same request i both times);
3. overload: X times that rate, open loop (seeded Poisson arrivals) for the duration, each chat
   at a seeded priority (PRIORITY_MIX), every chat measured.

The load generator, records and percentiles are loadgen.py's and metrics.py's; the numbers are
overload_report.py's. The bench's own mesh has no API keys, so the router's fair share between
keys is not exercised and per_key_share is null.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from rich.console import Console
from rich.table import Table
from tiermesh.client import AsyncRouterClient

from services.bench.hybrid_bench import BenchError, LoadOptions, MeshTarget, mesh_json
from services.bench.loadgen import (
    CONFIGURATIONS,
    LoadRun,
    RequestRecord,
    run_closed_loop,
    run_open_loop,
)
from services.bench.metrics import latency
from services.bench.overload_report import overload_summary, table_rows, targets
from services.bench.scenarios import RequestSequence, Scenario, arrival_times, schedule_digest
from services.common.errors import ConfigError
from services.workload import TRAFFIC_MIX, WorkloadItem

PRIORITY_MIX: Mapping[str, float] = {"interactive": 0.6, "batch": 0.3, "critical": 0.1}
UNLOADED_CLIENTS = 2
RAMP_START_RPS = 2.0
RAMP_FACTOR = 2.0
RAMP_STEP_S = 2.0
SETTLE_S = 1.0  # between phases: chats a closed loop cancelled leave the tiers
MAX_IN_FLIGHT = 2048  # the generator's own cap: far over what the router admits (max_inflight)
NO_KEYS = (
    "not measured: the bench's mesh runs without API keys, and the router's fair share "
    "(FAIR_SHARE) is per key"
)


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


def priority_of(seed: int, mix: Mapping[str, float] = PRIORITY_MIX) -> Callable[[int], str]:
    """The priority of request i: drawn by the mix from a generator seeded by (seed, i), so it
    is the same in every run whatever else changes."""
    names = list(mix)
    weights = [mix[n] for n in names]

    def pick(index: int) -> str:
        return random.Random(f"priority:{seed}:{index}").choices(names, weights)[0]

    return pick


def next_rate(served: Sequence[float], refused: Sequence[float], factor: float) -> float:
    """The ramp's next rate: `factor` times the highest served so far until a rate is not
    served, then the geometric middle between the highest served and the lowest not served."""
    if not refused:
        return max(served) * factor
    low = max(served, default=min(refused) / factor**2)
    return math.sqrt(low * min(refused))


class Strided:
    """Every stride-th request of a sequence: request k is the sequence's k * stride."""

    def __init__(self, sequence: RequestSequence, stride: int) -> None:
        self.sequence, self.stride = sequence, stride

    def __getitem__(self, index: int) -> WorkloadItem:
        return self.sequence[index * self.stride]


def unloaded_stride(requests: int, chat_s: float | None, unloaded_s: float) -> int:
    """The stride that spreads the unloaded pass (UNLOADED_CLIENTS closed-loop clients for
    unloaded_s, chats of about chat_s) over `requests` requests."""
    expected = UNLOADED_CLIENTS * unloaded_s / max(chat_s or 0.0, 0.001)
    return max(1, int(requests / expected))


def answered_rate(records: Sequence[RequestRecord]) -> float | None:
    """Chats answered per second from the first sent to the last answered: past capacity, the
    rate the mesh serves (a short step's excess waits in the tiers' queues and is answered
    later, so every chat of it may be answered, at this rate)."""
    answered = [r for r in records if r.ok and r.finished_at_s is not None]
    if not answered:
        return None
    span = max(r.finished_at_s or 0.0 for r in answered) - min(r.sent_at_s for r in records)
    return round(len(answered) / span, 3) if span > 0 else None


def capacity_of(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The highest rate served, but no more than the highest rate the mesh answered at in a
    step it did not serve (a queue that absorbed a short step hides the excess)."""
    served = [row["rate_rps"] for row in rows if row["served"]]
    answering = [row["answered_rps"] for row in rows if not row["served"] and row["answered_rps"]]
    if not served:
        return None
    return round(float(min(max(served), max(answering, default=max(served)))), 3)


def capacity_step_ok(
    records: Sequence[RequestRecord], ttft_bound_ms: float
) -> tuple[bool, dict[str, Any]]:
    """Whether one ramp step was served: every chat answered, none stepped down, TTFT p99
    within the bound; and the step's numbers."""
    answered = [r for r in records if r.ok]
    p99 = latency(records)["ttft_ms"]["p99"]
    stepped = sum(1 for r in records if r.stepped_from)
    ok = bool(records) and len(answered) == len(records) and not stepped
    ok = ok and p99 is not None and p99 <= ttft_bound_ms
    return ok, {
        "sent": len(records),
        "answered": len(answered),
        "answered_rps": answered_rate(records),
        "stepped_down": stepped,
        "ttft_ms_p99": p99,
    }


async def find_capacity(
    client: AsyncRouterClient,
    sequence: RequestSequence,
    load: LoadOptions,
    *,
    budget_s: float,
    ttft_bound_ms: float,
    seed: int,
    start_rps: float = RAMP_START_RPS,
    factor: float = RAMP_FACTOR,
    step_s: float = RAMP_STEP_S,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The open-loop ramp: step_s of routed interactive chats at each rate (budget_s of steps
    in all), from start_rps, each step's rate next_rate's; capacity_rps is the highest rate
    served, with the steps and a warning when it is only a bound."""
    steps = max(1, int(budget_s // step_s))
    served: list[float] = []
    answered: list[RequestRecord] = []
    refused: list[float] = []
    rows: list[dict[str, Any]] = []
    rate = start_rps
    for k in range(steps):
        scenario = Scenario("capacity", "constant", rate, step_s, 0.0, TRAFFIC_MIX, seed + k)
        run = LoadRun(client, CONFIGURATIONS["hybrid"], load.max_tokens, load.timeout_s)
        records = await run_open_loop(run, arrival_times(scenario), sequence, MAX_IN_FLIGHT)
        ok, row = capacity_step_ok(records, ttft_bound_ms)
        if k == 0:  # the lowest rate: the chats' length nearest to unloaded
            answered = [r for r in records if r.ok]
        rows.append({"rate_rps": round(rate, 3), "served": ok, **row})
        if progress is not None:
            progress(f"capacity ramp: {rate:.3g} req/s {'served' if ok else 'not served'}")
        (served if ok else refused).append(rate)
        if not ok and row["answered_rps"]:  # the next steps look below what it answered at
            refused.append(row["answered_rps"])
        await asyncio.sleep(SETTLE_S)
        rate = next_rate(served, refused, factor)
    capacity = capacity_of(rows)
    chats_s = [r.final_s for r in answered if r.final_s is not None]
    warnings = []
    if capacity is None:
        capacity = round(min(refused), 3)
        warnings.append(
            f"no ramp step was served: capacity taken as the lowest rate tried, {capacity:g} "
            "req/s, an upper bound"
        )
    elif not refused:
        warnings.append(
            f"every ramp step was served: capacity {capacity:g} req/s is a lower "
            "bound (a longer --capacity-s ramps higher)"
        )
    return {
        "capacity_rps": capacity,
        # a chat's mean length in the ramp's first step: sizes the unloaded pass's stride
        "chat_s": round(sum(chats_s) / len(chats_s), 4) if chats_s else None,
        "ramp": rows,
        "warnings": warnings,
    }


async def run_overload(
    target: MeshTarget,
    *,
    load_x: float,
    duration_s: float,
    seed: int,
    load: LoadOptions,
    capacity_s: float,
    unloaded_s: float,
    ttft_bound_ms: float,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The three phases; returns the report object."""
    if load_x <= 0 or duration_s <= 0 or capacity_s <= 0 or unloaded_s <= 0:
        raise BenchError("--load, --duration, --capacity-s and --unloaded-s must be > 0")
    say = progress or (lambda _text: None)
    sequence = RequestSequence(TRAFFIC_MIX, seed)
    hybrid = CONFIGURATIONS["hybrid"]
    async with AsyncRouterClient(target.router) as client:
        capacity = await find_capacity(
            client,
            sequence,
            load,
            budget_s=capacity_s,
            ttft_bound_ms=ttft_bound_ms,
            seed=seed + 1000,
            progress=say,
        )
        await asyncio.sleep(SETTLE_S)
        rate = capacity["capacity_rps"] * load_x
        scenario = Scenario("overload", "constant", rate, duration_s, 0.0, TRAFFIC_MIX, seed)
        arrivals = arrival_times(scenario)
        stride = unloaded_stride(len(arrivals), capacity["chat_s"], unloaded_s)
        say(f"unloaded pass: {UNLOADED_CLIENTS} clients for {unloaded_s:g} s, every {stride}th")
        run = LoadRun(client, hybrid, load.max_tokens, load.timeout_s)
        strided = cast(RequestSequence, Strided(sequence, stride))
        unloaded = await run_closed_loop(run, strided, UNLOADED_CLIENTS, unloaded_s)
        for record in unloaded:  # request k of the pass is request k * stride of the sequence
            record.index *= stride
        await asyncio.sleep(SETTLE_S)
        say(
            f"overload: {load_x:g} x {capacity['capacity_rps']:g} = {rate:g} req/s for "
            f"{duration_s:g} s ({len(arrivals)} chats)"
        )
        run = LoadRun(
            client, hybrid, load.max_tokens, load.timeout_s, priority_of=priority_of(seed)
        )
        records = await run_open_loop(run, arrivals, sequence, MAX_IN_FLIGHT)
    items: dict[str, WorkloadItem] = {
        sequence[r.index].id: sequence[r.index] for r in (*records, *unloaded)
    }
    summary = overload_summary(records, unloaded, items)
    report: dict[str, Any] = {
        "benchmark": "overload",
        "version": 1,
        "capacity_rps": capacity["capacity_rps"],
        "load": load_x,
        "rate_rps": round(rate, 3),
        "duration_s": duration_s,
        # what the mesh answered under the overload, against the ramp's capacity_rps
        "answered_rps": round(sum(1 for r in records if r.ok) / duration_s, 3),
        **{k: v for k, v in summary.items()},
        "per_key_share": None,
        "per_key_share_note": NO_KEYS,
        "targets": targets(summary),
        "scenario": {
            "mix": dict(TRAFFIC_MIX),
            "priority_mix": dict(PRIORITY_MIX),
            "seed": seed,
            "requests_scheduled": len(arrivals),
            "schedule_digest": schedule_digest(arrivals, sequence),
            "max_tokens": load.max_tokens,
            "timeout_s": load.timeout_s,
            "unloaded_clients": UNLOADED_CLIENTS,
            "unloaded_s": unloaded_s,
            "unloaded_stride": stride,
            "capacity_ttft_bound_ms": ttft_bound_ms,
        },
        "capacity": capacity,
        "mesh": mesh_json(target),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "warnings": capacity["warnings"],
    }
    return report


def print_report(report: Mapping[str, Any], console: Console) -> None:
    table = Table(
        title=f"overload: {report['load']:g} x capacity {report['capacity_rps']:g} req/s "
        f"for {report['duration_s']:g} s"
    )
    for column in (
        "priority",
        "sent",
        "answered",
        "stepped down",
        "quality vs unloaded",
        "TTFT p50 / p99 ms",
    ):
        table.add_column(column, justify="left" if column == "priority" else "right")
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
    console.print(f"per_key_share: {report['per_key_share_note']}")
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {warning}")


def run_overload_command(
    args: argparse.Namespace, console: Console, mesh: Callable[[], Any]
) -> int:
    """`tiermesh bench --scenario overload`: `mesh()` is the context manager of the mesh to
    drive (the bench's own, or --router's)."""
    load = LoadOptions(args.max_tokens, args.timeout)
    try:
        if args.load is None:
            raise BenchError("--scenario overload needs --load X (times the measured capacity)")
        with mesh() as target:
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
                )
            )
    except (BenchError, ConfigError, ValueError) as e:
        console.print(f"[red]tiermesh bench:[/red] {e}")
        return 2
    print_report(report, console)
    if args.json:
        print(json.dumps(report))
    return 0
