"""A traffic probe: calls TierService.GetStatus on a target (an `xds:///tier-...` target goes
through grpcio's own xDS client) and counts which backend answered, by the model it reports.

`probe_counts` makes N calls and returns the counts; `follow` keeps calling and prints one JSON
line per window, with the first time each backend answered in it, so the moment traffic moved
can be read off. Knows nothing of the control plane; the xDS bootstrap comes from the
environment (see `mesh.bootstrap`).
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TextIO

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

ERROR = "error"


def _caller(channel: grpc.Channel, timeout_s: float) -> Callable[[], str]:
    stub = tier_pb2_grpc.TierServiceStub(channel)

    def call() -> str:
        try:
            status = stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            return f"{ERROR}:{e.code().name}"
        return str(status.model or status.tier)

    return call


def probe_counts(target: str, calls: int, timeout_s: float = 5.0) -> dict[str, int]:
    """Counts of answers by backend over `calls` sequential calls (errors as `error:CODE`)."""
    with grpc.insecure_channel(target) as channel:
        call = _caller(channel, timeout_s)
        return dict(Counter(call() for _ in range(calls)))


def follow(
    target: str,
    duration_s: float,
    window_s: float = 0.02,
    pause_s: float = 0.002,
    timeout_s: float = 2.0,
    out: TextIO = sys.stdout,
) -> None:
    """Calls for `duration_s` (pausing `pause_s` between calls), printing {"t", "counts",
    "first"} per window of `window_s`."""
    with grpc.insecure_channel(target) as channel:
        call = _caller(channel, timeout_s)
        end = time.time() + duration_s
        while time.time() < end:
            window_end = time.time() + window_s
            counts: Counter[str] = Counter()
            first: dict[str, float] = {}
            while time.time() < window_end:
                backend = call()
                counts[backend] += 1
                first.setdefault(backend, time.time())
                time.sleep(pause_s)
            line = {"t": time.time(), "counts": dict(counts), "first": first}
            out.write(json.dumps(line) + "\n")
            out.flush()
