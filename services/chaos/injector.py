"""Injects one planned fault into a running mesh and measures when the mesh has recovered from it.

Process faults send signals to the launcher's children (the supervisor restarts what was
killed); request faults (overload, poison, slow readers) go through the router's gRPC API; slow
connections are raw sockets to the gateway or the router (slow_connections_fault.py).
`recovered_ms` is, from the moment of injection: for a process fault, until every process hit
answers gRPC health SERVING again; for overload, slow readers and slow connections, until a chat
sent after the fault ended is answered; for poison, until every poison request has ended.
Knows processes,
gRPC and the SDK; nothing of the checks or the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from tiermesh.client import AsyncRouterClient, ChatError
from tiermesh.v1 import common_pb2, router_pb2, router_pb2_grpc, tier_pb2, tier_pb2_grpc

from services.bench.loadgen import RequestRecord
from services.chaos.faults import (
    CONTROL_PLANE,
    HANG_TIER,
    KILL_REPLICA,
    KILL_TIER,
    OVERLOAD,
    POISON,
    SLOW_CONNECTIONS,
    SLOW_READER,
    PlannedFault,
)
from services.chaos.slow_connections_fault import (
    SlowConnectionsSettings,
    inject_slow_connections,
)
from services.common.child_process import Child
from services.common.percentiles import percentile
from services.common.serving import NotServingError, wait_serving_async

RECOVERY_TIMEOUT_S = 180.0
MID_STREAM_WAIT_S = 1.0  # before a kill, wait up to this long for the target to be streaming
CHAT_METHOD = "/tiermesh.v1.RouterService/Chat"
SLOW_READERS = 16

Burst = Callable[[float], Awaitable[list[RequestRecord]]]  # seconds -> the burst's records


@dataclass
class FaultRecord:
    kind: str
    target: str
    at_s: float  # when it was injected, seconds after the load started
    recovered_ms: float | None = None  # None: not recovered within RECOVERY_TIMEOUT_S
    detail: dict[str, Any] = field(default_factory=dict)
    # how a Final.reason names a call to what the fault hit ("small (127.0.0.1:5)", "small")
    reason_markers: tuple[str, ...] = ()

    def window_end_s(self) -> float:
        return self.at_s + (self.recovered_ms or 0.0) / 1000


@dataclass
class Injector:
    children: dict[str, Child]  # by name: "small", "small-2", "router", "control-plane", ...
    processes: dict[str, list[str]]  # tier -> its process names
    router: str
    burst: Burst
    hold_s: float = 3.0  # how long a hang, an overload burst or slow readers last
    max_tokens: int = 160
    start: float = field(default_factory=time.perf_counter)
    slow_connections: SlowConnectionsSettings = field(default_factory=SlowConnectionsSettings)

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def inject(self, fault: PlannedFault) -> FaultRecord:
        record = FaultRecord(fault.kind, fault.target, round(self.now(), 3))
        began = time.perf_counter()
        if fault.kind in (KILL_TIER, KILL_REPLICA, HANG_TIER, CONTROL_PLANE):
            names = self._process_names(fault)
            record.detail["processes"] = names
            record.reason_markers = self._reason_markers(names)
            if fault.kind != CONTROL_PLANE:
                record.detail["streaming"] = await self._mid_stream(names)
            record.at_s = round(self.now(), 3)
            began = time.perf_counter()
            pids = self._pids(names)
            if fault.kind == HANG_TIER:
                self._signal(names, signal.SIGSTOP)
                await asyncio.sleep(self.hold_s)
                self._signal(names, signal.SIGCONT)
            else:
                self._signal(names, signal.SIGKILL)
            done = await self._wait_serving(names, pids, began, record.detail)
        elif fault.kind == OVERLOAD:
            records = await self.burst(self.hold_s)
            record.detail.update(burst_summary(records))
            done = await self._canary(began)
        elif fault.kind == POISON:
            record.detail["requests"] = await self._poison()
            done = time.perf_counter()
        elif fault.kind == SLOW_READER:
            record.detail["streams"] = await self._slow_readers(SLOW_READERS)
            done = await self._canary(began)
        elif fault.kind == SLOW_CONNECTIONS:

            def attack_starts() -> None:
                nonlocal began
                record.at_s = round(self.now(), 3)
                began = time.perf_counter()

            gateway = self.children.get("gateway")
            record.detail.update(
                await inject_slow_connections(
                    fault.target,
                    self.children[fault.target],
                    gateway.address if gateway is not None else None,
                    self.router,
                    self.hold_s,
                    self.slow_connections,
                    attack_starts,
                )
            )
            done = await self._canary(began)
        else:
            raise ValueError(f"unknown fault {fault.kind!r}")
        if done is not None:
            record.recovered_ms = round((done - began) * 1000, 1)
        return record

    def _process_names(self, fault: PlannedFault) -> list[str]:
        if fault.kind in (KILL_TIER, HANG_TIER):
            return list(self.processes[fault.target])
        return [fault.target]

    def _reason_markers(self, names: Sequence[str]) -> tuple[str, ...]:
        """The router names a replica by tier and address when its tier has several, else by
        tier alone (services.router.chat_session)."""
        markers = []
        for name in names:
            tier = name.partition("-")[0]
            if len(self.processes.get(tier, [])) > 1:
                markers.append(f"{tier} ({self.children[name].address}) failed")
            elif tier in self.processes:
                markers.append(f"{tier} failed")
        return tuple(markers)

    def _signal(self, names: Sequence[str], sig: signal.Signals) -> None:
        for name in names:
            process = self.children[name].process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    async def _mid_stream(self, names: Sequence[str]) -> bool:
        """Waits (up to MID_STREAM_WAIT_S) until one of the processes is running a request."""
        deadline = time.perf_counter() + MID_STREAM_WAIT_S
        while time.perf_counter() < deadline:
            for name in names:
                async with grpc.aio.insecure_channel(self.children[name].address) as channel:
                    stub = tier_pb2_grpc.TierServiceStub(channel)
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        status = await stub.GetStatus(tier_pb2.GetStatusRequest(), timeout=0.5)
                        if status.running > 0:
                            return True
            await asyncio.sleep(0.05)
        return False

    def _pids(self, names: Sequence[str]) -> dict[str, int | None]:
        processes = {name: self.children[name].process for name in names}
        return {name: p.pid if p is not None else None for name, p in processes.items()}

    async def _wait_serving(
        self,
        names: Sequence[str],
        pids: dict[str, int | None],
        began: float,
        detail: dict[str, Any],
    ) -> float | None:
        """When every named process answered health SERVING again after the fault. A process
        that the supervisor replaced adds, to `detail`, when it was restarted and how long the
        new one took to serve (`restarted_ms`, `load_ms`: the longest of the named ones)."""
        await asyncio.sleep(0.05)
        restarted: dict[str, float] = {}
        for name in names:

            def supervised(name: str = name) -> None:
                """Never an exit (the supervisor restarts the process): notes when it did."""
                if name not in restarted and self._pids([name])[name] != pids[name]:
                    restarted[name] = time.perf_counter()

            supervised()
            remaining = RECOVERY_TIMEOUT_S - (time.perf_counter() - began)
            try:
                await wait_serving_async(
                    self.children[name].address, remaining, exited=supervised, interval_s=0.02
                )
            except NotServingError:
                return None
            supervised()  # replaced between the last two checks
            if name in restarted:
                load_ms = (time.perf_counter() - restarted[name]) * 1000
                detail["load_ms"] = round(max(load_ms, detail.get("load_ms", 0.0)), 1)
        if restarted:
            detail["restarted_ms"] = round((max(restarted.values()) - began) * 1000, 1)
        return time.perf_counter()

    async def _canary(self, began: float) -> float | None:
        """When a short routed chat sent now is answered (retried until it is)."""
        async with AsyncRouterClient(self.router) as client:
            while time.perf_counter() - began < RECOVERY_TIMEOUT_S:
                with contextlib.suppress(ChatError):
                    await client.chat("Where is my order?", max_tokens=4, timeout=10)
                    return time.perf_counter()
                await asyncio.sleep(0.05)
        return None

    async def _poison(self) -> dict[str, str]:
        """Sends each poison request once, all at the same time; their statuses by name."""
        requests = poison_requests(self.max_tokens)
        async with grpc.aio.insecure_channel(self.router) as channel:
            chat = channel.unary_stream(CHAT_METHOD)  # bytes in, bytes out

            async def send(body: bytes) -> str:
                try:
                    async for _ in chat(body, timeout=60):
                        pass
                except grpc.aio.AioRpcError as e:
                    return str(e.code().name)
                return "OK"

            statuses = await asyncio.gather(*(send(body) for body in requests.values()))
        return dict(zip(requests, statuses, strict=True))

    async def _slow_readers(self, count: int) -> int:
        """Opens `count` chats, reads nothing for hold_s, then cancels them."""
        request = router_pb2.ChatRequest(
            prompt="Tell me everything about your shipping and return policies.",
            max_tokens=self.max_tokens,
        )
        async with grpc.aio.insecure_channel(self.router) as channel:
            stub = router_pb2_grpc.RouterServiceStub(channel)
            calls = [stub.Chat(request, timeout=120) for _ in range(count)]
            await asyncio.sleep(self.hold_s)
            for call in calls:
                call.cancel()
        return count


def poison_requests(max_tokens: int) -> dict[str, bytes]:
    """Serialized ChatRequests that must each fail (or pass) alone: an overflowing temperature,
    invalid UTF-8 in the prompt, too many tokens, the smallest and largest sampling settings."""

    def chat(**fields: Any) -> bytes:
        sampling = common_pb2.SamplingParams(**fields.pop("sampling", {}))
        fields.setdefault("max_tokens", max_tokens)
        request = router_pb2.ChatRequest(sampling=sampling, **fields)
        return request.SerializeToString()

    prompt = "Where is my order?"
    bad_utf8 = chat(prompt="PLACEHOLDER!").replace(b"PLACEHOLDER!", b"Where\xff\xfeorder")
    return {
        "temperature 1e-40": chat(prompt=prompt, sampling={"temperature": 1e-40}),
        "temperature -1": chat(prompt=prompt, sampling={"temperature": -1.0}),
        "top_p 1e-9": chat(prompt=prompt, sampling={"temperature": 1.0, "top_p": 1e-9}),
        "invalid UTF-8 prompt": bad_utf8,
        "max_tokens 1000000": chat(prompt=prompt, max_tokens=1_000_000),
    }


def burst_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """An overload burst's outcome: its requests by status and how fast refusals came."""
    statuses = Counter(r.status for r in records)
    refusals = [
        (r.finished_at_s - r.sent_at_s) * 1000
        for r in records
        if r.status == "RESOURCE_EXHAUSTED" and r.finished_at_s is not None
    ]
    p50, p99 = percentile(refusals, 0.50), percentile(refusals, 0.99)
    by_source: dict[str, list[float]] = {}
    for r in records:
        if r.status == "RESOURCE_EXHAUSTED" and r.finished_at_s is not None:
            ms = (r.finished_at_s - r.sent_at_s) * 1000
            by_source.setdefault(refusal_source(r.error), []).append(ms)
    return {
        "requests": {"sent": len(records), "statuses": dict(statuses)},
        "refusal_ms_p50": None if p50 is None else round(p50, 1),
        "refusal_ms_p99": None if p99 is None else round(p99, 1),
        "refusals_by_source": {
            source: {
                "count": len(times),
                "ms_p50": round(percentile(times, 0.50) or 0.0, 1),
                "ms_p99": round(percentile(times, 0.99) or 0.0, 1),
            }
            for source, times in sorted(by_source.items())
        },
    }


def refusal_source(message: str) -> str:
    """Who refused, from a RESOURCE_EXHAUSTED's message: "router" (every tier full, or at
    capacity), "<tier> at admission", or "<tier> after queueing" (its wait ran out)."""
    if not message.startswith("tier "):
        return "router"
    tier, _, rest = message.removeprefix("tier ").partition(": ")
    return f"{tier} after queueing" if "no running slot within" in rest else f"{tier} at admission"
