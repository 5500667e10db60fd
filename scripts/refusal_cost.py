"""Measures what refusing a connection past its cap costs the server: the CPU of an HTTP
gateway process (refused in its listening socket's accept) and of a bare gRPC server built by
`start_server` (grpc closes a connection past `grpc.max_allowed_incoming_connections` after
accepting it), each under connections that open, send a partial request and are refused, reopened
at once for `--seconds`, from one loopback address.

Starts each server as its own process on a free port, reads its CPU time from /proc (Linux)
before and after, and prints microseconds of the server's CPU per connection opened; `--json`
adds one JSON object as the last line.

    .venv/bin/python scripts/refusal_cost.py [--seconds 6] [--connections 500] [--held 10,4096]
        [--json]

`--held` are the gRPC server's caps to measure with: up to that many connections are held (until
its 5 s handshake deadline) while the rest are refused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.chaos.slow_connections import hold_connections
from services.common.child_process import spawn, stop_process
from services.common.ports import free_port

GRPC_SERVER = """
import asyncio, sys
from services.common.grpc_service import ServerLimits, start_server

async def main() -> None:
    limits = ServerLimits(max_connections=int(sys.argv[2]))
    running = await start_server("127.0.0.1", int(sys.argv[1]), lambda s: None, [], limits=limits)
    await asyncio.Event().wait()  # `running` referenced: an unreferenced grpc.aio server stops
    print(running)

asyncio.run(main())
"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _listening(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await asyncio.sleep(1.0)  # settled after start-up
        return


async def measure(command: list[str], port: int, kind: str, args: argparse.Namespace) -> dict:
    process = spawn(command)
    try:
        await _listening(port)
        before = cpu_seconds(process.pid)
        tally = await hold_connections(
            "127.0.0.1",
            port,
            kind,
            args.connections,
            args.seconds,
            reopen_s=0.0,
            source="127.0.0.5",
        )
        used = cpu_seconds(process.pid) - before
    finally:
        stop_process(process, 5.0)
    return {
        "connections": tally.opened,
        "refused_fast": tally.refused_fast,
        "server_cpu_s": round(used, 2),
        "us_per_connection": round(used / max(1, tally.opened) * 1e6, 1),
    }


async def main(args: argparse.Namespace) -> dict:
    results = {}
    port = free_port()
    gateway = [sys.executable, "-m", "services.gateway", "--port", str(port)]
    gateway += ["--router", f"127.0.0.1:{free_port()}", "--max-connections-per-client", "1"]
    results["gateway"] = await measure(gateway, port, "http", args)
    for held in args.held:
        port = free_port()
        command = [sys.executable, "-c", GRPC_SERVER, str(port), str(held)]
        results[f"grpc, cap {held}"] = await measure(command, port, "h2", args)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--connections", type=int, default=500, help="opened at once")
    parser.add_argument("--held", default="10,4096", help="gRPC caps to measure with")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.held = [int(value) for value in args.held.split(",")]
    results = asyncio.run(main(args))
    for name, result in results.items():
        print(
            f"{name}: {result['connections']} connections ({result['refused_fast']} refused "
            f"within 1 s), server CPU {result['server_cpu_s']} s: "
            f"{result['us_per_connection']} us per connection"
        )
    if args.json:
        print(json.dumps(results))
