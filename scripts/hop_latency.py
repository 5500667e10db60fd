"""Measures what the router hop costs: time to the first token of a direct small-tier call
against the first draft delta through the router (pinned and progressive), side by side.

Starts one small tier and one router as separate processes (as `tiermesh run` does), then runs
the three request kinds interleaved so machine noise hits them alike. Prints p50/p99 and the
router's p50 overhead; `--json` adds one JSON object as the last line.

    .venv/bin/python scripts/hop_latency.py [--requests 200] [--model PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table
from tiermesh.v1 import router_pb2, router_pb2_grpc, tier_pb2, tier_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.router.launcher import _serving  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind")
    parser.add_argument("--model", type=Path, help="small-tier model (default: its config's)")
    parser.add_argument(
        "--refine-model", type=Path, help="large-tier model (default: its config's)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    tier_port, router_port = free_port(), free_port()
    tier_cmd = [sys.executable, "-m", "services.tier_small", "--port", str(tier_port)]
    if args.model:
        tier_cmd += ["--model", str(args.model)]
    router_cmd = [sys.executable, "-m", "services.router", "--port", str(router_port)]
    router_cmd += [
        "--tier",
        f"small=127.0.0.1:{tier_port}",
        "--tier",
        f"large=127.0.0.1:{tier_port}",
    ]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for cmd in (tier_cmd, router_cmd)
    ]
    try:
        deadline = time.monotonic() + 120
        for port in (tier_port, router_port):
            while not _serving(f"127.0.0.1:{port}"):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    console.print("[red]services did not start[/red]")
                    return 1
                time.sleep(0.2)
        results = measure(tier_port, router_port, args.requests, console)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    report(results, console, args.json)
    return 0


def measure(tier_port: int, router_port: int, n: int, console: Console) -> dict[str, list[float]]:
    prompt = "What is your return policy?"
    tier = tier_pb2_grpc.TierServiceStub(grpc.insecure_channel(f"127.0.0.1:{tier_port}"))
    router = router_pb2_grpc.RouterServiceStub(grpc.insecure_channel(f"127.0.0.1:{router_port}"))
    message = [{"role": "user", "content": prompt}]
    kinds = {
        "direct small tier": lambda i: tier.Generate(
            tier_pb2.GenerateRequest(request_id=f"d{i}", messages=message, max_tokens=8)
        ),
        "router, pinned small": lambda i: router.Chat(
            router_pb2.ChatRequest(
                prompt=prompt, mode=router_pb2.MODE_PINNED, tier="small", max_tokens=8
            )
        ),
        "router, progressive draft": lambda i: router.Chat(
            router_pb2.ChatRequest(prompt=prompt, mode=router_pb2.MODE_PROGRESSIVE, max_tokens=8)
        ),
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
        p50, p99 = statistics.median(values), percentile(values, 0.99)
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
        console.print(f"router hop p50 overhead ({name}): {ms:+.2f} ms")
    if as_json:
        print(json.dumps({"paths": summary, "p50_overhead_ms": overhead}))


if __name__ == "__main__":
    sys.exit(main())
