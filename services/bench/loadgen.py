"""Drives load through the router's SDK: open-loop arrivals and closed-loop clients.

Open loop: each arrival of a schedule is its own task, sent at its time whatever the servers
do, so slow servers cannot slow the offered load; a cap on requests in flight bounds the
generator itself, and an arrival over the cap is recorded as shed by the client. Closed loop:
N clients, each sending its next request when the previous one ends.

Every request becomes a RequestRecord with client-side timings. Knows the SDK's events; nothing
of tiers, prices or reports.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tiermesh.client import AsyncRouterClient, ChatError, DeltaEvent, FinalEvent, RouteEvent

from services.bench.scenarios import RequestSequence
from services.common.config import GATES, POLICIES
from services.workload import WorkloadItem

FAILURE_BACKOFF_S = 0.05  # closed loop: a client waits this long after a failed request, so a
# saturated tier rejecting at once cannot turn N clients into a busy loop that eats the CPU
SHED = "SHED"  # status of an arrival the generator dropped because too many were in flight
OK = "OK"


@dataclass(frozen=True)
class Configuration:
    """One way of serving every request: a router mode, the tier when pinned, and the routing
    policy the router runs with ("" = the one in its config)."""

    name: str  # "single", "hybrid", "progressive", "hybrid:<policy>", "progressive:<gate>"
    mode: str  # SDK mode name
    tier: str = ""
    policy: str = ""
    gate: str = ""  # progressive gate ("" = the router's)

    def options(self) -> dict[str, Any]:
        return {"mode": self.mode, "tier": self.tier, "progressive_gate": self.gate}


CONFIGURATIONS = {
    "single": Configuration("single", "pinned", "large"),
    "hybrid": Configuration("hybrid", "routed"),
    "progressive": Configuration("progressive", "progressive"),
}
POLICY_PREFIX = "hybrid:"  # "hybrid:threshold": hybrid with the router running that policy
GATE_PREFIX = "progressive:"  # "progressive:always": progressive chats asking for that gate


def configuration(name: str) -> Configuration:
    """The configuration called `name`: one of CONFIGURATIONS, or "hybrid:<policy>" for any
    routing policy the router knows. Raises ValueError naming what is accepted."""
    if name in CONFIGURATIONS:
        return CONFIGURATIONS[name]
    policy = name.removeprefix(POLICY_PREFIX)
    if name.startswith(POLICY_PREFIX) and policy in POLICIES:
        return Configuration(name, "routed", policy=policy)
    gate = name.removeprefix(GATE_PREFIX)
    if name.startswith(GATE_PREFIX) and gate in GATES:
        return Configuration(name, "progressive", gate=gate)
    raise ValueError(
        f"unknown configuration {name!r}: expected one of {', '.join(CONFIGURATIONS)}, "
        f"{POLICY_PREFIX}<policy> with a policy from {', '.join(POLICIES)}, or "
        f"{GATE_PREFIX}<gate> with a gate from {', '.join(GATES)}"
    )


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds: `*_at_s` since the run started,
    the others since the request was sent."""

    index: int
    item_id: str
    request_class: str
    scheduled_at_s: float
    sent_at_s: float = 0.0
    status: str = OK  # OK, SHED, or the gRPC status name it failed with
    error: str = ""
    ttft_s: float | None = None  # first delta of any revision
    first_draft_s: float | None = None  # first delta of revision 0
    final_s: float | None = None  # Final received: the answer complete
    finished_at_s: float | None = None
    tier: str = ""  # tier of the final revision
    revisions: int = 0
    output_tokens: int = 0  # completion tokens of the final revision
    text: str = ""  # the final revision's text
    server_timings: dict[str, float] = field(default_factory=dict)
    policy: str = ""  # the routing policy that decided, from the router's route decision
    route_reason: str = ""  # why, from the same route decision (e.g. a load-aware fallback)
    complexity: float | None = None  # the policy's complexity score, from the route decision
    priority: str = "interactive"  # the chat's priority: interactive, batch or critical
    routed_tier: str = ""  # the first tier of the route decision
    stepped_from: str = ""  # the tier overload moved the chat off, from the route decision
    error_reason: str = ""  # ErrorInfo of a failed chat, e.g. FAIR_SHARE or OVERLOADED
    api_key: str = ""  # the name of the API key it was sent under ("": the run's client's)

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadCounters:
    """Live counts for progress displays."""

    sent: int = 0
    completed: int = 0
    failed: int = 0
    shed: int = 0
    in_flight: int = 0


@dataclass
class LoadRun:
    """Shared settings of one load run through one client."""

    client: AsyncRouterClient
    configuration: Configuration
    max_tokens: int
    timeout_s: float
    counters: LoadCounters = field(default_factory=LoadCounters)
    on_record: Callable[[RequestRecord], None] | None = None
    # the priority of request i (None: every chat interactive, the router's default)
    priority_of: Callable[[int], str] | None = None
    # the name of the API key request i is sent under, and each key's client (None: `client`)
    key_of: Callable[[int], str] | None = None
    key_clients: Mapping[str, AsyncRouterClient] = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)

    def now(self) -> float:
        return time.perf_counter() - self.start

    def _finish(self, record: RequestRecord) -> RequestRecord:
        counters = self.counters
        if record.status == SHED:
            counters.shed += 1
        elif record.ok:
            counters.completed += 1
        else:
            counters.failed += 1
        if self.on_record is not None:
            self.on_record(record)
        return record

    async def send(self, record: RequestRecord, item: WorkloadItem) -> RequestRecord:
        """Sends one chat and fills in the record from its events."""
        record.sent_at_s = self.now()
        sent = time.perf_counter()
        self.counters.sent += 1
        self.counters.in_flight += 1
        token_counts: dict[int, int] = {}
        if self.priority_of is not None:
            record.priority = self.priority_of(record.index)
        client = self.client
        if self.key_of is not None:
            record.api_key = self.key_of(record.index)
            client = self.key_clients[record.api_key]
        try:
            async for event in client.chat_stream(
                item.prompt,
                timeout=self.timeout_s,
                max_tokens=self.max_tokens,
                request_id=f"bench-{self.configuration.name}-{record.index}",
                priority=record.priority,
                **self.configuration.options(),
            ):
                elapsed = time.perf_counter() - sent
                if isinstance(event, DeltaEvent) and (event.text or event.token_ids):
                    if record.ttft_s is None:
                        record.ttft_s = elapsed
                    if event.revision == 0 and record.first_draft_s is None:
                        record.first_draft_s = elapsed
                    token_counts[event.revision] = token_counts.get(event.revision, 0) + len(
                        event.token_ids
                    )
                elif isinstance(event, RouteEvent):
                    record.policy = event.policy
                    record.route_reason = event.reason
                    record.complexity = event.complexity
                    record.routed_tier = event.tiers[0] if event.tiers else ""
                    record.stepped_from = event.stepped_from
                elif isinstance(event, FinalEvent):
                    record.final_s = elapsed
                    record.tier = event.tier
                    record.text = event.text
                    record.revisions = event.revisions
                    record.server_timings = dict(event.timings)
                    record.output_tokens = _final_tokens(event, token_counts)
        except ChatError as e:
            record.status, record.error = e.code, e.message
            record.error_reason = e.details.reason
        except asyncio.CancelledError:
            record.status, record.error = "CANCELLED", "the run ended first"
            raise
        except Exception as e:  # a client-side failure must not end the whole run
            record.status, record.error = "CLIENT_ERROR", f"{type(e).__name__}: {e}"
        finally:
            self.counters.in_flight -= 1
            record.finished_at_s = self.now()
        if record.ok and record.final_s is None:
            record.status, record.error = "INTERNAL", "stream ended without Final"
        return self._finish(record)


def _final_tokens(final: FinalEvent, token_counts: dict[int, int]) -> int:
    """Completion tokens of the final revision: from the router's usage, else counted."""
    for usage in final.usage:
        if usage.get("revision") == final.revision and usage.get("tier") == final.tier:
            return int(usage.get("completion_tokens", 0))
    return token_counts.get(final.revision, 0)


async def run_open_loop(
    run: LoadRun,
    arrivals: Sequence[float],
    sequence: RequestSequence,
    max_in_flight: int,
) -> list[RequestRecord]:
    """Sends request i at arrivals[i] (seconds after the start) whatever the servers do;
    returns every record (shed ones included), in arrival order, once all have ended."""
    records: list[RequestRecord] = []
    tasks: set[asyncio.Task[RequestRecord]] = set()
    run.start = time.perf_counter()
    for index, at in enumerate(arrivals):
        delay = at - run.now()
        if delay > 0:
            await asyncio.sleep(delay)
        item = sequence[index]
        record = RequestRecord(index, item.id, item.request_class, at)
        records.append(record)
        if len(tasks) >= max_in_flight:
            record.sent_at_s = record.finished_at_s = run.now()
            record.status, record.error = SHED, f"over {max_in_flight} requests in flight"
            run._finish(record)
            continue
        task = asyncio.create_task(run.send(record, item))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return records


async def run_closed_loop(
    run: LoadRun, sequence: RequestSequence, clients: int, duration_s: float
) -> list[RequestRecord]:
    """`clients` clients, each sending the next request of the shared sequence as soon as its
    previous one ends (or FAILURE_BACKOFF_S after it failed), for duration_s seconds; requests
    still running then are cancelled and left out. Returns the records of requests that ended,
    in send order."""
    records: list[RequestRecord] = []
    counter = itertools.count()
    run.start = time.perf_counter()

    async def client_loop() -> None:
        while run.now() < duration_s:
            index = next(counter)
            item = sequence[index]
            record = RequestRecord(index, item.id, item.request_class, run.now())
            await run.send(record, item)
            records.append(record)
            if not record.ok:
                await asyncio.sleep(FAILURE_BACKOFF_S)

    workers = [asyncio.create_task(client_loop()) for _ in range(clients)]
    await asyncio.wait(workers, timeout=max(0.0, duration_s - run.now()))
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return sorted(records, key=lambda r: r.index)
