"""Hot swap of a tier's model under load: starts `python -m services.tier_<tier>` as a process,
keeps --streams greedy streams going against it, swaps its model to each --to folder and back
(TierAdminService.SwapModel), and reports each swap's load, switch and drain times from the
tier with what the clients saw: requests failed, requests started after the switch yet answered
by the old model, and the longest wait between two chunks of one stream while the swap ran.

    .venv/bin/python scripts/hot_swap.py --tier small --to services/tier_medium/model \
        --to models/smollm2-135m [--streams 4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.child_process import spawn, stop_process
from services.common.ports import free_port
from services.common.serving import NotServingError, wait_serving

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["What is your return policy?", "How much does the blue kettle cost?", "Hello"]


@dataclass
class Load:
    """What the streams saw: requests by outcome, and each request's model and timing."""

    ok: int = 0
    failed: list[tuple[float, str]] = field(default_factory=list)  # (when, the status)
    # (started, the model that answered, when it started and got each chunk)
    requests: list[tuple[float, str, list[float]]] = field(default_factory=list)
    running: bool = True


async def stream_loop(stub: tier_pb2_grpc.TierServiceStub, load: Load, worker: int) -> None:
    n = 0
    while load.running:
        n += 1
        request = tier_pb2.GenerateRequest(
            request_id=f"w{worker}-{n}", prompt=PROMPTS[n % len(PROMPTS)], max_tokens=48
        )
        started = time.perf_counter()
        times: list[float] = []
        model = ""
        try:
            async for chunk in stub.Generate(request):
                times.append(time.perf_counter())
                model = chunk.model or model
            load.ok += 1
        except grpc.aio.AioRpcError as e:
            load.failed.append((time.perf_counter(), f"{e.code().name}: {e.details()}"))
        load.requests.append((started, model, [started, *times]))


def window_stats(load: Load, start: float, switched: float, end: float, old: str) -> dict[str, Any]:
    """Of the requests that ran while the swap did: how many, how many failed, how many started
    after the switch (as the client learnt of it) yet were answered by the old model, and the
    longest waits for a chunk."""
    during = [r for r in load.requests if r[2][-1] >= start and r[0] <= end]
    late_on_old = sum(1 for started, model, _ in during if started > switched and model == old)

    def longest_gap(since: float, until: float, on_old: bool | None = None) -> float:
        """The longest wait for a chunk (the first included) that came in [since, until], of
        requests on the old model, the new one, or either (None), in ms."""
        gaps = [
            b - a
            for _, model, times in during
            if on_old is None or (model == old) == on_old
            for a, b in itertools.pairwise(times)
            if since <= b <= until
        ]
        return round(max(gaps, default=0.0) * 1000, 1)

    return {
        "requests_during_swap": len(during),
        "failed_requests": sum(1 for when, _ in load.failed if start <= when <= end),
        "started_after_switch_on_old_model": late_on_old,
        "longest_chunk_wait_loading_ms": longest_gap(start, switched),
        "longest_chunk_wait_after_switch_old_model_ms": longest_gap(switched, end, True),
        "longest_chunk_wait_after_switch_new_model_ms": longest_gap(switched, end, False),
    }


Swap = tuple[tier_pb2.ModelSwap, float, float, float]  # last record, start, switched, end


async def swap(admin: tier_pb2_grpc.TierAdminServiceStub, folder: Path) -> Swap:
    start = time.perf_counter()
    switched = start
    record = tier_pb2.ModelSwap()
    async for response in admin.SwapModel(tier_pb2.SwapModelRequest(model_path=str(folder))):
        record = response.swap
        if record.phase == "switched":
            switched = time.perf_counter()
    end = time.perf_counter()
    await asyncio.sleep(1.0)  # requests that began on the new model finish
    return record, start, switched, end


def swap_row(load: Load, swap: Swap) -> dict[str, Any]:
    record, start, switched, end = swap
    return {
        "from": record.old_model_id,
        "to": record.new_model_id,
        "load_s": round(record.load_s, 3),
        "switch_ms": round(record.switch_s * 1000, 3),
        "drain_s": round(record.drain_s, 3),
        "streams_on_old": record.streams_on_old,
        "streams_cut": record.streams_cut,
        "freed_mb": round(record.freed_bytes / 1e6, 1),
        **window_stats(load, start, switched, end, record.old_model_id),
    }


async def measure(address: str, own: Path, targets: list[Path], streams: int) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        load = Load()
        workers = [asyncio.create_task(stream_loop(stub, load, w)) for w in range(streams)]
        await asyncio.sleep(2.0)  # steady load before the first swap
        steady = time.perf_counter()
        await asyncio.sleep(3.0)
        steady_end = time.perf_counter()
        swaps = []
        for folder in targets:
            swaps.append(await swap(admin, folder))
            swaps.append(await swap(admin, own))
        load.running = False
        await asyncio.gather(*workers)
    without = window_stats(load, steady, steady_end, steady_end, "")
    return {
        "streams": streams,
        "requests_ok": load.ok,
        "failures": [status for _, status in load.failed],
        "longest_chunk_wait_without_swap_ms": without["longest_chunk_wait_loading_ms"],
        "swaps": [swap_row(load, s) for s in swaps],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", default="small", choices=("small", "medium", "large"))
    parser.add_argument("--to", type=Path, action="append", required=True, help="model folder")
    parser.add_argument("--streams", type=int, default=4, help="concurrent greedy streams")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    own = (ROOT / "services" / f"tier_{args.tier}" / "model").resolve()
    port = free_port()
    address = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as work:
        log_path = Path(work) / "tier.log"
        command = [sys.executable, "-m", f"services.tier_{args.tier}", "--port", str(port)]
        command += ["--metrics-port", "0"]
        tier = spawn(command, log_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        try:
            try:
                wait_serving(address, 300, exited=tier.poll)
            except NotServingError as e:
                print(log_path.read_text(), e, sep="\n", file=sys.stderr)
                return 1
            targets = [folder.resolve() for folder in args.to]
            report = asyncio.run(measure(address, own, targets, args.streams))
        finally:
            stop_process(tier, grace_s=30)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{args.streams} streams, {report['requests_ok']} requests OK, "
        f"{len(report['failures'])} failed {report['failures'][:3]}; longest wait for a chunk "
        f"in 3 s without a swap {report['longest_chunk_wait_without_swap_ms']} ms"
    )
    for s in report["swaps"]:
        print(
            f"{s['from']} -> {s['to']}: load {s['load_s']:.2f} s, switch {s['switch_ms']:.3f} ms, "
            f"drain {s['drain_s']:.2f} s ({s['streams_on_old']} on old, {s['streams_cut']} cut), "
            f"freed {s['freed_mb']} MB; {s['requests_during_swap']} requests during the swap, "
            f"{s['failed_requests']} failed, {s['started_after_switch_on_old_model']} started "
            f"after the switch on the old model; longest wait for a chunk while loading "
            f"{s['longest_chunk_wait_loading_ms']} ms, after the switch "
            f"{s['longest_chunk_wait_after_switch_old_model_ms']} ms on the old model and "
            f"{s['longest_chunk_wait_after_switch_new_model_ms']} ms on the new"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
