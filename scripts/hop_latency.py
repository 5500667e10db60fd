"""Measures what the router hop and tracing cost: time to the first token of a direct
small-tier call, against the first draft delta through the router (pinned and progressive),
and through a second, identical router whose services export every span (tracing on).

Starts two copies of (small tier, large tier, router) as separate processes, as `tiermesh run`
does, the second with TIERMESH_TRACE_FILE set, then runs all request kinds interleaved so
machine noise hits them alike. Prints p50/p99 and the p50 overheads; `--json` adds one JSON
object as the last line.

    .venv/bin/python scripts/hop_latency.py [--requests 200] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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

from services.common.percentiles import percentile  # noqa: E402
from services.launcher.local_mesh import is_serving  # noqa: E402

PROMPT = "What is your return policy?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_services(
    models: dict[str, Path | None], env: dict[str, str]
) -> tuple[list[subprocess.Popen[bytes]], dict[str, int]]:
    ports = {"small": free_port(), "large": free_port(), "router": free_port()}
    commands = []
    for tier in ("small", "large"):
        command = [sys.executable, "-m", f"services.tier_{tier}", "--port", str(ports[tier])]
        command += ["--metrics-port", "0"]
        model = models.get(tier)
        commands.append(command + (["--model", str(model)] if model else []))
    router = [sys.executable, "-m", "services.router", "--port", str(ports["router"])]
    router += ["--metrics-port", "0"]
    router += ["--tier", f"small=127.0.0.1:{ports['small']}"]
    router += ["--tier", f"medium=127.0.0.1:{ports['small']}"]
    router += ["--tier", f"large=127.0.0.1:{ports['large']}"]
    commands.append(router)
    procs = [
        subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for c in commands
    ]
    return procs, ports


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind")
    parser.add_argument("--model", type=Path, help="small-tier model (default: its config's)")
    parser.add_argument("--refine-model", type=Path, help="large-tier model (default: config's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    models = {"small": args.model, "large": args.refine_model}
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TIERMESH_TRACE"))}
    with tempfile.TemporaryDirectory() as tmp:
        traced = {**plain, "TIERMESH_TRACE_FILE": str(Path(tmp) / "spans.jsonl")}
        procs_a, ports_a = start_services(models, plain)
        procs_b, ports_b = start_services(models, traced)
        procs = procs_a + procs_b
        try:
            deadline = time.monotonic() + 180
            for port in [*ports_a.values(), *ports_b.values()]:
                while not is_serving(f"127.0.0.1:{port}"):
                    if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                        console.print("[red]services did not start[/red]")
                        return 1
                    time.sleep(0.2)
            results = measure(ports_a, ports_b, args.requests, console)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
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
    }
    results: dict[str, list[float]] = {name: [] for name in kinds}
    with console.status("measuring…") as status:
        for i in range(-10, n):  # the first 10 rounds warm up and are not counted
            for name, start in kinds.items():
                t0 = time.perf_counter()
                first = None
                for message_ in start(i):
                    if first is None and _has_token(message_):
                        first = (time.perf_counter() - t0) * 1000
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
    if as_json:
        print(json.dumps({"paths": summary, "p50_overhead_ms": overhead, "tracing_ms": tracing}))


if __name__ == "__main__":
    sys.exit(main())
