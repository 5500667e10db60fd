"""`tiermesh bench` and `tiermesh bench sweep`: single (every request pinned to the large tier),
hybrid (routed) and progressive, one after the other against the same running mesh, with the
same seeded arrivals and requests, and one report object for all of them.

Starts its own mesh as child processes (the launcher's functions, free ports) or drives a
running router. Knows the order of a run and the report's shape; measuring, pricing, scoring and
display live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from tiermesh.client import AsyncRouterClient

from services.bench.costs import PriceProfile, cost_per_million_tokens
from services.bench.loadgen import (
    CONFIGURATIONS,
    POLICY_PREFIX,
    SHED,
    Configuration,
    LoadCounters,
    LoadRun,
    RequestRecord,
    configuration,
    run_closed_loop,
    run_open_loop,
)
from services.bench.metrics import (
    RequestScores,
    in_window,
    overload_warnings,
    percentile,
    quality_ci95,
    ratios_vs,
    request_scores,
    summarise,
    unanswered_warnings,
)
from services.bench.resources import ResourceMonitor, ServiceHandle
from services.bench.scenarios import RequestSequence, Scenario, arrival_times, schedule_digest
from services.common.child_process import Child
from services.common.tiers import TIER_NAMES
from services.launcher.child_health import wait_healthy
from services.launcher.echo_tiers import EchoSettings
from services.launcher.local_mesh import free_base_port, plan_children, started, stop_all
from services.launcher.secure_run import SecureRun
from services.workload import WorkloadItem

BASELINE = "single"
CPU_TIME_SOURCE = "/proc/<pid>/stat utime+stime (psutil not used)"
# (configuration, seconds since its start, its length, live counts), a few times a second
Ticker = Callable[[str, float, float, LoadCounters], None]


class BenchError(Exception):
    """The benchmark could not run (mesh did not start, bad option); the message says why."""


@dataclass
class MeshTarget:
    """The mesh a benchmark drives: its router and the services it can watch."""

    router: str
    services: list[ServiceHandle]
    started_by_bench: bool = False
    # the bench's own mesh only: restarts the router on a routing policy ("" = its config's)
    restart_router: Callable[[str], None] | None = None
    policy: str = ""  # the policy the router was last started with ("" = its config's)

    def check_policies(self, configurations: Sequence[Configuration]) -> None:
        """Raises BenchError if a configuration needs a policy this target cannot switch to."""
        if self.restart_router is None and any(c.policy for c in configurations):
            raise BenchError(
                f"{POLICY_PREFIX}<policy> configurations restart the router on each policy: "
                "they need the bench's own mesh (no --router)"
            )

    def use_policy(self, policy: str) -> None:
        """Makes the router run `policy` ("" = its config's), restarting it if it runs another."""
        if policy != self.policy and self.restart_router is not None:
            self.restart_router(policy)
            self.policy = policy


@dataclass
class LoadOptions:
    """How each request is sent."""

    max_tokens: int = 200  # longer than every reference answer of the workload (186 tokens)
    timeout_s: float = 30.0  # gRPC deadline of one chat
    max_in_flight: int = 128  # open loop: arrivals over this many in flight are shed
    idle_timeout_s: float = 60.0  # between configurations: wait this long for idle tiers


@contextlib.contextmanager
def own_mesh(
    *,
    base_port: int | None,
    models: dict[str, Path],
    device: str | None,
    log_dir: Path,
    console: Console,
    echo: EchoSettings | None = None,
    secure: SecureRun | None = None,
) -> Iterator[MeshTarget]:
    """Starts the three tiers (echo tiers with `echo`) and the router as child processes and
    stops them on exit. With `secure`, every hop speaks TLS and the router enforces its keys
    file, as under `tiermesh run --secure`."""
    from services.common.errors import ConfigError

    try:
        planned = plan_children(
            free_base_port() if base_port is None else base_port,
            models,
            device,
            log_dir,
            echo=echo,
            secure=secure,
        )
        # the bench drives the router over gRPC: no HTTP gateway taking CPU beside it
        children = [child for child in planned if child.name != "gateway"]
    except (ConfigError, OSError) as e:
        raise BenchError(str(e)) from None
    credentials = secure.launcher_credentials() if secure is not None else None
    error = BenchError(f"the mesh did not start; logs in {log_dir}")
    with started(children, console, error, credentials=credentials):
        services = [
            ServiceHandle(
                c.name,
                c.address,
                c.process.pid if c.process else None,
                is_tier=c.name in TIER_NAMES,
            )
            for c in children
        ]
        router = children[-1]
        restart = functools.partial(_restart_router, router, list(router.command), services)
        yield MeshTarget(router.address, services, started_by_bench=True, restart_router=restart)


def _restart_router(
    router: Child, command: list[str], services: list[ServiceHandle], policy: str
) -> None:
    """Stops the bench's router (draining) and starts it again with `policy` ("" = its
    config's); returns once it serves. The router's handle in `services` takes the new pid."""
    stop_all([router])
    router.command = [*command, "--policy", policy] if policy else list(command)
    router.start(append=True)
    # a console of its own: the bench's shows the live progress, and rich runs one live display
    # per console
    if not wait_healthy([router], Console(quiet=True)):
        code = router.exited()
        why = "timed out" if code is None else f"exited with code {code}"
        raise BenchError(f"the router restarted on policy {policy!r} {why}:\n{router.log_tail()}")
    pid = router.process.pid if router.process else None
    services[:] = [replace(s, pid=pid) if s.name == "router" else s for s in services]


def _lag_ms_p99(records: Sequence[RequestRecord]) -> float | None:
    lags = [(r.sent_at_s - r.scheduled_at_s) * 1000 for r in records if r.status != SHED]
    value = percentile(lags, 0.99)
    return None if value is None else round(value, 2)


async def _measure(
    monitor: ResourceMonitor,
    name: str,
    run: LoadRun,
    warmup_s: float,
    end_s: float,
    load: Callable[[], Awaitable[list[RequestRecord]]],
    ticker: Ticker | None,
) -> tuple[list[RequestRecord], dict[str, float]]:
    """Runs `load()` while sampling CPU seconds at warmup_s and end_s; returns its records and
    the CPU seconds each service spent inside the window."""
    marks: dict[str, dict[str, float]] = {}

    async def mark(at_s: float, key: str) -> None:
        await asyncio.sleep(max(0.0, at_s - run.now()))
        marks[key] = monitor.cpu_seconds()

    async def tick() -> None:
        while True:
            if ticker is not None:
                ticker(name, run.now(), end_s, run.counters)
            await asyncio.sleep(0.25)

    monitor.reset()
    helpers = [
        asyncio.create_task(mark(warmup_s, "start")),
        asyncio.create_task(mark(end_s, "end")),
        asyncio.create_task(tick()),
    ]
    try:
        records = await load()
    finally:
        await asyncio.gather(*helpers[:2], return_exceptions=True)
        helpers[2].cancel()
        await asyncio.gather(helpers[2], return_exceptions=True)
    if ticker is not None:
        ticker(name, end_s, end_s, run.counters)
    start, end = marks.get("start", {}), marks.get("end", {})
    cpu = {k: round(end[k] - start[k], 3) for k in end if k in start}
    return records, cpu


async def run_configurations(
    target: MeshTarget,
    scenario: Scenario,
    names: Sequence[str],
    load: LoadOptions,
    prices: dict[str, PriceProfile],
    ticker: Ticker | None = None,
) -> tuple[dict[str, Any], dict[str, list[RequestRecord]]]:
    """Every configuration in turn under the scenario's open-loop schedule; returns the
    report object and the records per configuration."""
    arrivals = arrival_times(scenario)
    sequence = RequestSequence(scenario.mix, scenario.seed)
    items: dict[str, WorkloadItem] = {sequence[i].id: sequence[i] for i in range(len(arrivals))}
    plan = [configuration(name) for name in names]
    target.check_policies(plan)
    monitor = ResourceMonitor(target.services)
    await monitor.start()
    configurations: dict[str, Any] = {}
    all_records: dict[str, list[RequestRecord]] = {}
    scores: dict[str, RequestScores] = {}  # per configuration, its measured requests' scores
    try:
        for config in plan:
            name = config.name
            await asyncio.to_thread(target.use_policy, config.policy)
            # a client per configuration: a restarted router is a new connection
            async with AsyncRouterClient(target.router) as client:
                run = LoadRun(client, config, load.max_tokens, load.timeout_s)
                records, cpu = await _measure(
                    monitor,
                    name,
                    run,
                    scenario.warmup_s,
                    scenario.duration_s,
                    functools.partial(run_open_loop, run, arrivals, sequence, load.max_in_flight),
                    ticker,
                )
                await monitor.sample()
                summary = summarise(records, items, scenario.warmup_s, scenario.duration_s)
                configurations[name] = {
                    "mode": config.mode,
                    "tier": config.tier or None,
                    "policy": config.policy or None,  # None: the router's configured policy
                    "progressive_gate": config.gate or None,  # None: the router's gate
                    **summary,
                    "schedule_lag_ms_p99": _lag_ms_p99(records),
                    "cpu_seconds": cpu,
                    # priced only when every tier's CPU time is known: a partial sum would
                    # favour whichever configuration used the unwatched tiers
                    "cost_per_1m_output_tokens": cost_per_million_tokens(
                        prices, cpu, summary["output_tokens"]
                    )
                    if all(tier in cpu for tier in TIER_NAMES)
                    else dict.fromkeys(prices),
                    "memory": monitor.memory_json(),
                }
                all_records[name] = records
                measured = in_window(records, scenario.warmup_s, scenario.duration_s)
                scores[name] = request_scores(measured, items)
                await monitor.wait_idle(load.idle_timeout_s)
    finally:
        await monitor.close()
    report = {
        "benchmark": "hybrid_vs_single",
        "version": 1,
        "scenario": {
            **scenario.to_json(),
            "loop": "open",
            "requests_scheduled": len(arrivals),
            "schedule_digest": schedule_digest(arrivals, sequence),
            "max_tokens": load.max_tokens,
            "timeout_s": load.timeout_s,
            "max_in_flight": load.max_in_flight,
        },
        "mesh": mesh_json(target),
        "cpu_time_source": CPU_TIME_SOURCE,
        "prices": {name: profile.to_json() for name, profile in prices.items()},
        "configurations": configurations,
        "ratios": {
            f"{name}_vs_{BASELINE}": ratios_vs(configurations[name], configurations[BASELINE])
            | quality_ci95(scores[name], scores[BASELINE])
            for name in configurations
            if name != BASELINE and BASELINE in configurations
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "warnings": [
            *overload_warnings(configurations),
            *unanswered_warnings(configurations, BASELINE),
        ],
    }
    return report, all_records


def mesh_json(target: MeshTarget) -> dict[str, Any]:
    return {
        "router": target.router,
        "started_by_bench": target.started_by_bench,
        "services": {
            s.name: {"address": s.address, "pid": s.pid, "tier": s.is_tier} for s in target.services
        },
    }


async def run_sweep(
    target: MeshTarget,
    scenario: Scenario,
    levels: Sequence[int],
    names: Sequence[str],
    load: LoadOptions,
    ticker: Ticker | None = None,
) -> dict[str, Any]:
    """Closed loop at each concurrency level, each configuration in turn at every level (so
    drift in the machine's speed hits them alike); the scenario gives mix, seed, duration and
    warm-up per level. Returns the sweep's report object."""
    sequence = RequestSequence(scenario.mix, scenario.seed)
    monitor = ResourceMonitor(target.services)
    await monitor.start()
    rows = []
    try:
        async with AsyncRouterClient(target.router) as client:
            for clients in levels:
                row: dict[str, Any] = {"clients": clients}
                for name in names:
                    run = LoadRun(client, CONFIGURATIONS[name], load.max_tokens, load.timeout_s)
                    records, cpu = await _measure(
                        monitor,
                        f"{name} x{clients}",
                        run,
                        scenario.warmup_s,
                        scenario.duration_s,
                        functools.partial(
                            run_closed_loop, run, sequence, clients, scenario.duration_s
                        ),
                        ticker,
                    )
                    items = {r.item_id: sequence[r.index] for r in records}
                    summary = summarise(records, items, scenario.warmup_s, scenario.duration_s)
                    row[name] = {
                        "throughput_rps": summary["throughput_rps"],
                        "output_tokens_per_s": summary["output_tokens_per_s"],
                        "requests": summary["requests"],
                        "latency": summary["latency"]["overall"],
                        "accuracy": summary["quality"]["accuracy"],
                        "cpu_seconds": cpu,
                    }
                    await monitor.wait_idle(load.idle_timeout_s)
                if BASELINE in row:
                    base = row[BASELINE]["throughput_rps"]
                    row["gain_pct"] = {
                        name: None
                        if not base
                        else round((row[name]["throughput_rps"] - base) / base * 100, 1)
                        for name in names
                        if name != BASELINE
                    }
                rows.append(row)
    finally:
        await monitor.close()
    return {
        "benchmark": "concurrency_sweep",
        "version": 1,
        "loop": "closed",
        "levels": list(levels),
        "configurations": list(names),
        "duration_s": scenario.duration_s,
        "warmup_s": scenario.warmup_s,
        "mix": dict(scenario.mix),
        "seed": scenario.seed,
        "max_tokens": load.max_tokens,
        "mesh": mesh_json(target),
        "rows": rows,
    }
