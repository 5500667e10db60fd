"""One `tiermesh chaos` run: starts a mesh with the launcher's machinery (its children, its
supervisor restarting what dies, `<run dir>/pids.json`), drives the bench's seeded open-loop load
through it while the fault schedule is injected, then asks the recovered mesh for a reference
answer of every (request, tier) that answered, and counts lost and duplicated tokens.

Every child is stopped on every way out (the launcher's stop order, then SIGKILL); children also
stop with this process if it is killed (services.common.parent_watch). Knows the order of a run;
faults, checks and the report live in their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from services.bench.loadgen import (
    Configuration,
    LoadCounters,
    LoadRun,
    RequestRecord,
    run_open_loop,
)
from services.bench.scenarios import RequestSequence, Scenario, arrival_times, build_scenario
from services.chaos.checks import ReferenceKey, account_tokens, reference_key
from services.chaos.faults import (
    OVERLOAD_FACTOR,
    SLOW_CONNECTIONS,
    PlannedFault,
    fault_targets,
    plan_faults,
)
from services.chaos.injector import FaultRecord, Injector
from services.chaos.loop_lag import LoopLag
from services.chaos.memory import MemoryWatch
from services.chaos.recording import RecordingClient
from services.chaos.report import build_report
from services.chaos.slow_connections_fault import SlowConnectionsSettings
from services.common.child_process import Child
from services.common.errors import TiermeshError
from services.common.serving import NotServingError, wait_serving_async
from services.common.tiers import TIER_NAMES
from services.launcher.child_health import is_healthy, is_http_healthy
from services.launcher.echo_tiers import EchoSettings
from services.launcher.local_mesh import free_base_port, plan_children, started
from services.launcher.run_options import TIER_NICE, ConnectionLimitFlags
from services.launcher.supervisor import RestartPolicy, Supervisor

# chaos kills on purpose: the supervisor restarts every time instead of giving up after 5
CHAOS_RESTARTS = RestartPolicy(max_crashes=1_000_000)
REFERENCE_CONCURRENCY = 4
Ticker = Callable[[float, float, LoadCounters, list[FaultRecord]], None]


class ChaosError(Exception):
    """The run could not be made (the mesh did not start, a bad option); the message says why."""


@dataclass
class ChaosOptions:
    faults: tuple[str, ...]
    scenario: str = "long-tail"
    rate_rps: float | None = None  # None: the scenario's
    duration_s: float = 30.0
    seed: int = 0
    fault_every_s: float = 5.0
    first_fault_s: float = 3.0
    hold_s: float = 3.0  # hang, overload burst and slow readers last this long
    tiers: tuple[str, ...] = TIER_NAMES  # the tiers tier faults may hit
    mode: str = "routed"
    max_tokens: int = 160
    timeout_s: float = 60.0
    max_in_flight: int = 512
    replicas: dict[str, int] | None = None
    tier_nice: int = TIER_NICE
    mesh: bool = False
    echo: EchoSettings | None = None
    models: dict[str, Path] = field(default_factory=dict)
    remotes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # TIER=openai: its URLs
    vllm: frozenset[str] = frozenset()  # the tiers on vLLM
    device: str | None = None
    base_port: int | None = None
    run_dir: Path = Path(".tiermesh/chaos")
    slow_connections: SlowConnectionsSettings = field(default_factory=SlowConnectionsSettings)
    limits: ConnectionLimitFlags = field(default_factory=ConnectionLimitFlags)


@contextlib.contextmanager
def chaos_mesh(options: ChaosOptions, console: Console) -> Iterator[list[Child]]:
    """The mesh's children (the HTTP gateway only for the slow-connections fault), all serving;
    stopped however the block ends."""
    try:
        planned = plan_children(
            options.base_port or free_base_port(),
            options.models,
            options.device,
            options.run_dir / "logs",
            mesh=options.mesh,
            replicas=options.replicas,
            echo=options.echo,
            tier_nice=options.tier_nice,
            limits=options.limits,
            remotes=options.remotes,
            vllm=options.vllm,
        )
    except (TiermeshError, OSError) as e:  # ConfigError: a missing model, --mesh with replicas
        raise ChaosError(str(e)) from None
    gateway = SLOW_CONNECTIONS in options.faults
    children = [child for child in planned if gateway or child.name != "gateway"]
    failed = ChaosError(f"the mesh did not start; logs in {options.run_dir / 'logs'}")
    # stopping continues a child left stopped by a hang first
    with started(children, console, failed, grace_s=10.0):
        yield children


class SupervisorThread:
    """The launcher's supervisor, polled every 0.2 s in a thread; its output goes to a log."""

    def __init__(self, children: list[Child], run_dir: Path) -> None:
        self.log_path = run_dir / "logs" / "supervisor.log"
        self._log = self.log_path.open("w")
        console = Console(file=self._log, width=120, force_terminal=False)
        self._supervisor = Supervisor(
            children, is_healthy, console, run_dir / "pids.json", CHAOS_RESTARTS
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._supervisor.poll()
            self._log.flush()

    def __enter__(self) -> SupervisorThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._log.close()


def tier_processes(children: Sequence[Child]) -> dict[str, list[str]]:
    processes: dict[str, list[str]] = {}
    for child in children:
        tier = child.name.partition("-")[0]
        if tier in TIER_NAMES:
            processes.setdefault(tier, []).append(child.name)
    return processes


def busy_key(fault: PlannedFault, processes: dict[str, list[str]]) -> str:
    """Faults with one key never overlap: one per tier (so a replica is killed only while the
    tier's other replicas are back), else one per kind (poison may come during an overload)."""
    tier = fault.target.partition("-")[0]
    return tier if tier in processes else fault.kind


def quiet_tail_s(options: ChaosOptions) -> float:
    """The end of the load when no fault starts, so that the run ends recovered."""
    return min(options.hold_s, options.duration_s / 4)


def scenario_of(options: ChaosOptions) -> Scenario:
    return build_scenario(
        options.scenario,
        duration_s=options.duration_s,
        warmup_s=0.0,
        rate_rps=options.rate_rps,
        seed=options.seed,
    )


async def run_chaos(
    options: ChaosOptions, console: Console, ticker: Ticker | None = None
) -> dict[str, Any]:
    """Starts the mesh, runs the load with its faults, checks every answer; the report."""
    scenario = scenario_of(options)
    planned = {  # the processes the launcher starts, to refuse an impossible fault before it does
        tier: [tier] + [f"{tier}-{n}" for n in range(2, (options.replicas or {}).get(tier, 1) + 1)]
        for tier in TIER_NAMES
    }
    for kind in options.faults:
        fault_targets(kind, options.tiers, planned, options.mesh)
    options.run_dir.mkdir(parents=True, exist_ok=True)
    with chaos_mesh(options, console) as children, SupervisorThread(children, options.run_dir):
        processes = tier_processes(children)
        targets = {
            kind: fault_targets(kind, options.tiers, processes, options.mesh)
            for kind in options.faults
        }
        plan = plan_faults(
            options.faults,
            targets,
            options.duration_s,
            options.first_fault_s,
            options.fault_every_s,
            quiet_tail_s=quiet_tail_s(options),
        )
        router = next(child.address for child in children if child.name == "router")
        memory = MemoryWatch(children)
        memory.sample()
        watcher = asyncio.create_task(memory.follow())
        try:
            result = await _drive(options, scenario, plan, children, processes, router, ticker)
            console.print("load done; waiting for every service to serve again…")
            await _all_serving(children)
            references = await _references(router, result.client, options)
        finally:
            watcher.cancel()
            memory.sample()
    account = account_tokens(result.client.traces, references, greedy=True)
    return build_report(
        run_json(options, scenario, result.skipped),
        result.records,
        result.faults,
        account,
        result.client.traces,
        memory,
        result.lag,
    )


def run_json(
    options: ChaosOptions, scenario: Scenario, skipped: Sequence[PlannedFault]
) -> dict[str, Any]:
    """The report's `run` entry: what was asked for, and the faults left out."""
    return {
        "faults_skipped": [
            {"kind": f.kind, "target": f.target, "planned_at_s": f.at_s} for f in skipped
        ],
        "scenario": scenario.to_json(),
        "mode": options.mode,
        "engine": "echo" if options.echo is not None else "model",
        # the tiers on another engine than `engine`: {"large": "vllm", ...}
        "tier_engines": {
            **{tier: "vllm" for tier in sorted(options.vllm)},
            **{tier: "openai" for tier in sorted(options.remotes)},
        },
        "replicas": options.replicas or {},
        "tier_nice": options.tier_nice,
        "mesh": options.mesh,
        "max_tokens": options.max_tokens,
        "timeout_s": options.timeout_s,
        "faults_asked": list(options.faults),
        "fault_every_s": options.fault_every_s,
        "hold_s": options.hold_s,
        "slow_connections": vars(options.slow_connections)
        if SLOW_CONNECTIONS in options.faults
        else None,
    }


@dataclass
class _Driven:
    client: RecordingClient
    records: list[RequestRecord]
    faults: list[FaultRecord]
    skipped: list[PlannedFault]  # their target was still recovering until the load's end
    lag: LoopLag  # this process's event-loop lag while the load ran


async def _drive(
    options: ChaosOptions,
    scenario: Scenario,
    plan: list[PlannedFault],
    children: list[Child],
    processes: dict[str, list[str]],
    router: str,
    ticker: Ticker | None,
) -> _Driven:
    arrivals = arrival_times(scenario)
    sequence = RequestSequence(scenario.mix, scenario.seed)
    client = RecordingClient(router)
    base = LoadRun(client, Configuration("chaos", options.mode), options.max_tokens, 60.0)
    base.timeout_s = options.timeout_s
    bursts = 0

    async def burst(seconds: float) -> list[RequestRecord]:
        """(OVERLOAD_FACTOR - 1) times the scenario's rate on top of it, for `seconds`."""
        nonlocal bursts
        bursts += 1
        extra = build_scenario(
            options.scenario,
            duration_s=seconds,
            warmup_s=0.0,
            rate_rps=scenario.rate_rps * (OVERLOAD_FACTOR - 1),
            seed=options.seed + 1000 + bursts,
        )
        run = LoadRun(
            client, Configuration(f"overload{bursts}", options.mode), options.max_tokens, 60.0
        )
        run.timeout_s = options.timeout_s
        extra_sequence = RequestSequence(extra.mix, extra.seed)
        return await run_open_loop(run, arrival_times(extra), extra_sequence, 10_000)

    injector = Injector(
        {c.name: c for c in children},
        processes,
        router,
        burst,
        hold_s=options.hold_s,
        max_tokens=options.max_tokens,
        slow_connections=options.slow_connections,
    )
    faults: list[FaultRecord] = []
    load = asyncio.create_task(run_open_loop(base, arrivals, sequence, options.max_in_flight))
    await asyncio.sleep(0)  # the load's clock starts
    injector.start = base.start

    busy: dict[str, asyncio.Event] = {}  # a target with a fault not yet recovered from
    skipped: list[PlannedFault] = []
    latest_s = options.duration_s - quiet_tail_s(options)

    async def inject_at(fault: PlannedFault) -> None:
        """At its time, or once a fault still running on the same target has ended."""
        delay = fault.at_s - injector.now()
        if delay > 0:
            await asyncio.sleep(delay)
        key = busy_key(fault, processes)
        while (running := busy.get(key)) is not None:
            await running.wait()
        if injector.now() > latest_s:  # its target was busy until the load's quiet end
            skipped.append(fault)
            return
        busy[key] = done = asyncio.Event()
        try:
            faults.append(await injector.inject(fault))
        finally:
            del busy[key]
            done.set()

    async def inject_all() -> None:
        await asyncio.gather(*(inject_at(fault) for fault in plan))
        faults.sort(key=lambda f: f.at_s)

    async def tick() -> None:
        while ticker is not None:
            ticker(base.now(), options.duration_s, base.counters, faults)
            await asyncio.sleep(0.25)

    ticking = asyncio.create_task(tick())
    lag = LoopLag()
    lagging = asyncio.create_task(lag.follow(base.now))
    try:
        records, _ = await asyncio.gather(load, inject_all())
    finally:
        ticking.cancel()
        lagging.cancel()
        if ticker is not None:
            ticker(base.now(), options.duration_s, base.counters, faults)
    return _Driven(client, records, faults, skipped, lag)


async def _all_serving(children: list[Child], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    for child in children:
        if child.health_url:  # the gateway: HTTP health
            while not await asyncio.to_thread(is_http_healthy, child.health_url):
                if time.monotonic() > deadline:
                    raise ChaosError(f"not serving again after the run: {child.name}")
                await asyncio.sleep(0.2)
            continue
        try:
            remaining = deadline - time.monotonic()
            await wait_serving_async(child.address, remaining, interval_s=0.2, name=child.name)
        except NotServingError as e:
            raise ChaosError(f"not serving again after the run: {e}") from None


async def _references(
    router: str, run_client: RecordingClient, options: ChaosOptions
) -> dict[ReferenceKey, list[int]]:
    """The unfaulted answer's token ids for each (item, tier) that answered a chat: the same
    prompt pinned to that tier on the recovered mesh. One that fails is left out (unchecked)."""
    wanted = {reference_key(trace) for trace in run_client.traces.values()}
    keys = sorted(key for key in wanted if key is not None)
    references: dict[ReferenceKey, list[int]] = {}
    gate = asyncio.Semaphore(REFERENCE_CONCURRENCY)
    async with RecordingClient(router) as client:

        async def one(index: int, prompt: str, tier: str) -> None:
            request_id = f"reference-{index}"
            async with gate:
                try:
                    result = await client.chat(
                        prompt,
                        mode="pinned",
                        tier=tier,
                        max_tokens=options.max_tokens,
                        request_id=request_id,
                        timeout=options.timeout_s,
                    )
                except Exception:
                    return
            revision = client.traces[request_id].revisions.get(result.revision)
            if revision is None or result.revision != 0:
                return  # not an unbroken answer: no reference
            references[(prompt, tier)] = list(revision.token_ids)

        await asyncio.gather(*(one(i, prompt, tier) for i, (prompt, tier) in enumerate(keys)))
    return references
