"""`tiermesh chaos`: seeded load against a mesh it starts, faults injected on a schedule, and
every answer checked for lost or duplicated tokens (see README.md in this folder).

tiermesh chaos [--faults kill-tier,hang-tier,...] [--duration S] [--replicas small=2] [--mesh]
               [--engine model|echo|TIER=vllm|TIER=openai] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from services.bench.hybrid_cli import LiveProgress, report_console
from services.bench.loadgen import LoadCounters
from services.bench.scenarios import SCENARIOS
from services.chaos.faults import FAULT_KINDS, FaultPlanError, parse_faults
from services.chaos.injector import FaultRecord
from services.chaos.report import print_report
from services.chaos.run import ChaosError, ChaosOptions, run_chaos
from services.chaos.slow_connections_fault import SlowConnectionsSettings
from services.common import env
from services.common.cpu_priority import nice_level
from services.common.tiers import TIER_NAMES
from services.launcher.echo_tiers import EchoSettings
from services.launcher.run_options import (
    TIER_NICE,
    add_connection_limit_flags,
    connection_limit_flags,
    engine_option,
    model_overrides,
    remote_models,
    replica_counts,
    tier_engines,
    vllm_tiers,
)

DEFAULT_FAULTS = "kill-tier,hang-tier,overload,poison,slow-reader"


def register(commands: Any) -> None:
    chaos = commands.add_parser(
        "chaos", help="seeded load + scheduled faults against a mesh it starts; lost tokens counted"
    )
    chaos.add_argument(
        "--faults",
        default=DEFAULT_FAULTS,
        help=f"faults in turn, comma-separated, from: {', '.join(FAULT_KINDS)} "
        f"(default {DEFAULT_FAULTS})",
    )
    chaos.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    chaos.add_argument("--fault-every", type=float, default=5.0, help="seconds between faults")
    chaos.add_argument("--first-fault", type=float, default=3.0, help="seconds to the first")
    chaos.add_argument(
        "--hold", type=float, default=3.0, help="seconds a hang, overload burst or slow read lasts"
    )
    chaos.add_argument(
        "--tiers", default=",".join(TIER_NAMES), help="tiers that tier faults may hit"
    )
    chaos.add_argument("--scenario", choices=tuple(SCENARIOS), default="long-tail")
    chaos.add_argument("--rate", type=float, help="requests per second (default: the scenario's)")
    chaos.add_argument("--seed", type=int, default=0)
    chaos.add_argument("--mode", choices=("routed", "progressive"), default="routed")
    chaos.add_argument("--max-tokens", type=int, default=160, help="tokens per answer at most")
    chaos.add_argument("--timeout", type=float, default=60.0, help="deadline of one chat (s)")
    chaos.add_argument("--replicas", metavar="TIER=N[,TIER=N]", help="processes per tier")
    chaos.add_argument(
        "--tier-nice",
        type=nice_level,
        default=TIER_NICE,
        metavar="N",
        help=f"the tiers' nice levels below the router's, as tiermesh run's (default {TIER_NICE})",
    )
    chaos.add_argument(
        "--mesh", action="store_true", help="with the xDS control plane (its fault needs it)"
    )
    chaos.add_argument(
        "--engine",
        action="append",
        type=engine_option,
        default=[],
        metavar="model|echo|TIER=vllm|TIER=openai",
        help="model: the tiers' configured models (default); echo: no model, a deterministic "
        "answer at --echo-ttft-ms and --echo-tokens-per-s (long runs); TIER=vllm: that tier on "
        "vLLM (its --model TIER=DIR); TIER=openai: that tier is the server --model TIER=URL names",
    )
    chaos.add_argument("--echo-ttft-ms", type=float, default=10.0)
    chaos.add_argument("--echo-tokens-per-s", type=float, default=100.0)
    chaos.add_argument("--model", action="append", default=[], metavar="TIER=PATH")
    chaos.add_argument("--device", help="device for every tier (cpu, cuda, cuda:N)")
    chaos.add_argument("--base-port", type=int, help="ports as tiermesh run's (default: free)")
    chaos.add_argument("--run-dir", type=Path, help="logs and pids.json (default: <run dir>/chaos)")
    chaos.add_argument(
        "--slow-connections",
        type=int,
        default=SlowConnectionsSettings.connections,
        metavar="N",
        help="slow-connections: connections that never finish their request, held for --hold "
        f"(default {SlowConnectionsSettings.connections})",
    )
    chaos.add_argument(
        "--slow-processes",
        type=int,
        default=SlowConnectionsSettings.processes,
        metavar="P",
        help="slow-connections: worker processes, each from its own loopback address "
        f"(default {SlowConnectionsSettings.processes})",
    )
    chaos.add_argument(
        "--slow-reopen",
        type=float,
        default=SlowConnectionsSettings.reopen_s,
        metavar="S",
        help="slow-connections: seconds before a connection the target closed is opened again "
        f"(default {SlowConnectionsSettings.reopen_s:g})",
    )
    chaos.add_argument(
        "--slow-nice",
        type=nice_level,
        default=SlowConnectionsSettings.nice,
        metavar="N",
        help="slow-connections: the attack's processes this many nice levels below this one "
        f"(default {SlowConnectionsSettings.nice}; 0: the same)",
    )
    add_connection_limit_flags(chaos)
    chaos.add_argument("--json", action="store_true", help="one JSON object as the last line")
    chaos.set_defaults(func=cmd_chaos)


def options_from(args: argparse.Namespace) -> ChaosOptions:
    tiers = tuple(t.strip() for t in args.tiers.split(",") if t.strip())
    unknown = [t for t in tiers if t not in TIER_NAMES]
    if unknown or not tiers:
        raise FaultPlanError(f"--tiers: expected names from {', '.join(TIER_NAMES)}")
    if args.slow_connections < 1 or not 1 <= args.slow_processes <= 64 or args.slow_reopen < 0:
        raise FaultPlanError(
            "--slow-connections must be >= 1, --slow-processes in [1, 64], --slow-reopen >= 0"
        )
    echo = None
    every_tier, remote_tiers = tier_engines(args.engine)
    if every_tier == "echo":
        echo = EchoSettings(ttft_ms=args.echo_ttft_ms, tokens_per_s=args.echo_tokens_per_s)
    return ChaosOptions(
        faults=parse_faults(args.faults),
        scenario=args.scenario,
        rate_rps=args.rate,
        duration_s=args.duration,
        seed=args.seed,
        fault_every_s=args.fault_every,
        first_fault_s=args.first_fault,
        hold_s=args.hold,
        tiers=tiers,
        mode=args.mode,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout,
        replicas=replica_counts(args.replicas) if args.replicas else None,
        tier_nice=args.tier_nice,
        mesh=args.mesh,
        echo=echo,
        models=model_overrides(args.model, remote=True),
        remotes=remote_models(args.model, remote_tiers),
        vllm=vllm_tiers(args.engine),
        device=args.device,
        base_port=args.base_port,
        run_dir=args.run_dir or Path(env.run_dir()) / "chaos",
        slow_connections=SlowConnectionsSettings(
            connections=args.slow_connections,
            processes=args.slow_processes,
            reopen_s=args.slow_reopen,
            nice=args.slow_nice,
        ),
        limits=connection_limit_flags(args),
    )


class _Progress:
    """The bench's live bar for the load, and a line per fault as it is injected."""

    def __init__(self, console: Console) -> None:
        self.live = LiveProgress(console)
        self._console = console
        self._shown = 0

    def tick(
        self, elapsed: float, total: float, c: LoadCounters, faults: list[FaultRecord]
    ) -> None:
        self.live.tick("chaos load", elapsed, total, c)
        for fault in faults[self._shown :]:
            recovered = (
                "not recovered" if fault.recovered_ms is None else f"{fault.recovered_ms:.0f}"
            )
            self._console.print(
                f"[yellow]{fault.kind}[/yellow] {fault.target} at {fault.at_s:.1f} s: "
                f"recovered in {recovered} ms"
            )
        self._shown = len(faults)


def _stop_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through every `finally`: the mesh is stopped


def cmd_chaos(args: argparse.Namespace) -> int:
    console = report_console(args.json)
    try:
        options = options_from(args)
    except FaultPlanError as e:
        console.print(f"[red]tiermesh chaos:[/red] {e}")
        return 2
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    progress = _Progress(console)
    try:
        with progress.live.progress:
            report = asyncio.run(run_chaos(options, console, progress.tick))
    except (ChaosError, ValueError) as e:  # FaultPlanError, a scenario's bad rate: ValueError
        console.print(f"[red]tiermesh chaos:[/red] {e}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_report(report, console)
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
    return 0
