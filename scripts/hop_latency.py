"""Measures what the router hop and tracing cost: time to the first token of a direct
small-tier call, against the first draft delta through the router (pinned and progressive),
and through a second, identical router whose services export every span (tracing on).

Starts two copies of (small tier, large tier, router) as separate processes, as `tiermesh run`
does (the tiers TIER_NICE levels below the router), the second with TIERMESH_TRACE_FILE set,
then runs all request kinds interleaved (each round starting one kind later) so machine noise
hits them alike. Prints p50/p99 and the p50 overheads; `--json` adds one JSON
object as the last line.

`--compare-src DIR` also starts a router from the source tree in DIR (another checkout, e.g.
`git archive <commit> services mesh | tar -x -C DIR`) on the first copy's tiers, and measures
it in the same interleaved rounds: before/after numbers of a router change from one run.
`--echo` runs echo tiers (no model, 10 ms TTFT) instead of the models; `--tier-src DIR` starts
the tiers from another source tree (the routers still run from this one).

Beside them, always: a bare gRPC relay on the first copy's small tier
(services/bench/grpc_relay_floor.py: RouterService.Chat relayed to one tier with the router's
event order, and nothing else), so the router's own share is read against the floor of any
grpc.aio relay on this host ("router over the relay floor"), from the same rounds.

    .venv/bin/python scripts/hop_latency.py [--requests 200] [--model PATH] [--json]
        [--compare-src DIR] [--echo] [--tier-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table
from tiermesh.v1 import router_pb2, router_pb2_grpc, tier_pb2, tier_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.common.child_process import spawn, stop_processes  # noqa: E402
from services.common.percentiles import percentile  # noqa: E402
from services.common.ports import free_port  # noqa: E402
from services.common.serving import NotServingError, wait_serving  # noqa: E402
from services.launcher.run_options import TIER_NICE  # noqa: E402

PROMPT = "What is your return policy?"
FLOOR = "bare gRPC relay (floor), pinned small"


def router_command(port: int, tiers: dict[str, int]) -> list[str]:
    router = [sys.executable, "-m", "services.router", "--port", str(port)]
    router += ["--metrics-port", "0"]
    router += ["--tier", f"small=127.0.0.1:{tiers['small']}"]
    router += ["--tier", f"medium=127.0.0.1:{tiers['small']}"]
    router += ["--tier", f"large=127.0.0.1:{tiers['large']}"]
    return router


def echo_config(tier: str, directory: Path) -> Path:
    """An echo tier config (no model), 10 ms TTFT, 200 tokens/s."""
    from services.launcher.echo_tiers import EchoSettings, write_echo_config

    source = ROOT / "services" / f"tier_{tier}" / "config.toml"
    return write_echo_config(source, directory, EchoSettings(ttft_ms=10.0, tokens_per_s=200.0))


def start_services(
    models: dict[str, Path | None],
    env: dict[str, str],
    echo_dir: Path | None = None,
    tier_src: Path = ROOT,
) -> tuple[list[subprocess.Popen[bytes]], dict[str, int]]:
    ports = {"small": free_port(), "large": free_port(), "router": free_port()}
    commands = []
    for tier in ("small", "large"):
        command = [sys.executable, "-m", f"services.tier_{tier}", "--port", str(ports[tier])]
        command += ["--metrics-port", "0"]
        model = models.get(tier)
        if echo_dir is not None:
            command += ["--config", str(echo_config(tier, echo_dir))]
        elif model:
            command += ["--model", str(model)]
        commands.append(command)
    # as `tiermesh run` starts them: below the router
    procs = [spawn(c, env=env, cwd=tier_src, nice=TIER_NICE) for c in commands]
    procs.append(spawn(router_command(ports["router"], ports), env=env))
    return procs, ports


def wait_all_serving(
    targets: dict[str, grpc.ChannelCredentials | None],
    procs: list[subprocess.Popen[bytes]],
    timeout_s: float = 180.0,
) -> None:
    """Every target's gRPC health SERVING (asked with its credentials) within `timeout_s` in
    all, and no process exited before; NotServingError otherwise."""
    deadline = time.monotonic() + timeout_s

    def exited() -> int | None:
        return next((p.returncode for p in procs if p.poll() is not None), None)

    for target, credentials in targets.items():
        remaining = deadline - time.monotonic()
        wait_serving(target, remaining, credentials=credentials, exited=exited)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind")
    parser.add_argument("--model", type=Path, help="small-tier model (default: its config's)")
    parser.add_argument("--refine-model", type=Path, help="large-tier model (default: config's)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compare-src", type=Path, help="also a router from this source tree")
    parser.add_argument("--echo", action="store_true", help="echo tiers instead of the models")
    parser.add_argument(
        "--tier-src", type=Path, default=ROOT, help="start the tiers from this source tree"
    )
    args = parser.parse_args()
    console = Console(stderr=args.json)
    models = {"small": args.model, "large": args.refine_model}
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIERMESH_TRACE"))}
    with tempfile.TemporaryDirectory() as tmp:
        traced = {**plain, "TIERMESH_TRACE_FILE": str(Path(tmp) / "spans.jsonl")}
        echo_dir = Path(tmp) if args.echo else None
        tier_src = args.tier_src.resolve()
        procs_a, ports_a = start_services(models, plain, echo_dir, tier_src)
        procs_b, ports_b = start_services(models, traced, echo_dir, tier_src)
        procs = procs_a + procs_b
        ports_a["floor"] = free_port()
        floor = [sys.executable, "-m", "services.bench.grpc_relay_floor"]
        floor += ["--tier", f"127.0.0.1:{ports_a['small']}", "--port", str(ports_a["floor"])]
        procs.append(spawn(floor, env=plain))
        if args.compare_src is not None:
            ports_a["compare"] = free_port()
            source = args.compare_src.resolve()
            procs.append(spawn(router_command(ports_a["compare"], ports_a), env=plain, cwd=source))
        try:
            try:
                ports = [*ports_a.values(), *ports_b.values()]
                wait_all_serving(dict.fromkeys(f"127.0.0.1:{port}" for port in ports), procs)
            except NotServingError as e:
                console.print(f"[red]services did not start[/red]: {e}")
                return 1
            results = measure(ports_a, ports_b, args.requests, console)
        finally:
            stop_processes(procs, grace_s=30)
    report(results, console, args.json)
    return 0


def measure(
    ports_a: dict[str, int], ports_b: dict[str, int], n: int, console: Console
) -> dict[str, list[float]]:
    tier = tier_pb2_grpc.TierServiceStub(grpc.insecure_channel(f"127.0.0.1:{ports_a['small']}"))
    router_a = router_pb2_grpc.RouterServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{ports_a['router']}")
    )
    router_b = router_pb2_grpc.RouterServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{ports_b['router']}")
    )
    floor = router_pb2_grpc.RouterServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{ports_a['floor']}")
    )
    message = [{"role": "user", "content": PROMPT}]
    pinned = router_pb2.ChatRequest(
        prompt=PROMPT, mode=router_pb2.MODE_PINNED, tier="small", max_tokens=8
    )
    progressive = router_pb2.ChatRequest(
        prompt=PROMPT, mode=router_pb2.MODE_PROGRESSIVE, max_tokens=8
    )
    kinds: dict[str, Callable[[int], Iterator[Any]]] = {
        "direct small tier": lambda i: tier.Generate(
            tier_pb2.GenerateRequest(request_id=f"d{i}", messages=message, max_tokens=8)
        ),
        "router, pinned small": lambda i: router_a.Chat(pinned),
        "router, pinned small, tracing on": lambda i: router_b.Chat(pinned),
        "router, progressive draft": lambda i: router_a.Chat(progressive),
        FLOOR: lambda i: floor.Chat(pinned),
    }
    if "compare" in ports_a:
        router_c = router_pb2_grpc.RouterServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{ports_a['compare']}")
        )
        kinds["compared router, pinned small"] = lambda i: router_c.Chat(pinned)
        kinds["compared router, progressive draft"] = lambda i: router_c.Chat(progressive)
    results: dict[str, list[float]] = {name: [] for name in kinds}
    with console.status("measuring…") as status:
        for i in range(-10, n):  # the first 10 rounds warm up and are not counted
            # each round starts one kind later, so every kind follows every other as often
            # (a request right after a progressive chat meets that chat's after-work)
            order = list(kinds.items())
            shift = i % len(order)
            for name, start in order[shift:] + order[:shift]:
                t0 = time.perf_counter()
                first = None
                try:
                    for message_ in start(i):
                        if first is None and _has_token(message_):
                            first = (time.perf_counter() - t0) * 1000
                except grpc.RpcError:
                    if i >= 0:
                        raise
                    # warm-up: a router may still be reconnecting to a tier that came up late
                    time.sleep(0.5)
                if i >= 0 and first is not None:
                    results[name].append(first)
            status.update(f"measuring… {max(i, 0)}/{n}")
    return results


def _has_token(message: object) -> bool:
    if isinstance(message, tier_pb2.GenerateChunk):
        return len(message.token_ids) > 0
    return isinstance(message, router_pb2.ChatEvent) and message.WhichOneof("event") == "delta"


def report(results: dict[str, list[float]], console: Console, as_json: bool) -> None:
    table = Table(title="time to first token / first draft delta (ms)")
    for column in ("path", "n", "p50", "p99"):
        table.add_column(column)
    summary = {}
    for name, values in results.items():
        p50, p99 = statistics.median(values), percentile(values, 0.99) or 0.0
        summary[name] = {"n": len(values), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
        table.add_row(name, str(len(values)), f"{p50:.2f}", f"{p99:.2f}")
    console.print(table)
    direct = summary["direct small tier"]["p50_ms"]
    overhead = {
        name: round(values["p50_ms"] - direct, 3)
        for name, values in summary.items()
        if name != "direct small tier"
    }
    for name, ms in overhead.items():
        console.print(f"p50 over a direct small-tier call ({name}): {ms:+.2f} ms")
    tracing = round(
        summary["router, pinned small, tracing on"]["p50_ms"]
        - summary["router, pinned small"]["p50_ms"],
        3,
    )
    console.print(f"tracing on, p50 cost through router + tier: {tracing:+.2f} ms")
    over_floor = round(summary["router, pinned small"]["p50_ms"] - summary[FLOOR]["p50_ms"], 3)
    console.print(f"router (pinned small) over the bare relay, p50: {over_floor:+.2f} ms")
    if as_json:
        print(
            json.dumps(
                {
                    "paths": summary,
                    "p50_overhead_ms": overhead,
                    "tracing_ms": tracing,
                    "router_over_floor_ms": over_floor,
                }
            )
        )


if __name__ == "__main__":
    sys.exit(main())
