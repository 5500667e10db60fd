"""`tiermesh bench --scenario overload --load X`: how the mesh behaves past its capacity.

Three phases against one mesh, all on the same seeded request sequence (the workload's traffic
mix):

1. capacity: an open-loop ramp of routed interactive chats in RAMP_STEP_S steps from
   RAMP_START_RPS, doubling until a step is not served (a refusal, a step-down or TTFT p99 over
   the bound), then halving the gap (geometric middle) for the steps --capacity-s leaves; the
   capacity is the highest rate served, at most the rate the mesh answered at in a step it did
   not serve (the tiers' queues absorb a short step);
2. unloaded: a closed loop of UNLOADED_CLIENTS routed interactive chats for a few seconds over
   every stride-th request of the sequence, the stride spreading them over the whole overload
   run: the answers and TTFT the loaded chats are compared with (the same request i both times);
3. overload: X times that rate, open loop (seeded Poisson arrivals) for the duration, each chat
   at a seeded priority (PRIORITY_MIX, or --priority for all) and under a seeded API key (--keys,
   each with its share of the rate by --key-rate-ratio), every chat measured.

With keys (2 unless told otherwise) the bench's own mesh runs as `tiermesh run --secure` does,
its certificates and keys in a temporary folder (overload_keys.py): the router's fair share
between keys applies and per_key_share reports each key. The ramp and the unloaded pass send
under the first key alone (a key alone has the whole mesh). The load generator, records and
percentiles are loadgen.py's and metrics.py's; the numbers are overload_report.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from tiermesh.client import AsyncRouterClient

from services.bench.hybrid_bench import BenchError, LoadOptions, MeshTarget, mesh_json
from services.bench.loadgen import (
    CONFIGURATIONS,
    LoadRun,
    RequestRecord,
    run_closed_loop,
    run_open_loop,
)
from services.bench.metrics import latency
from services.bench.overload_keys import BenchKeys, key_of
from services.bench.overload_report import overload_summary, targets
from services.bench.scenarios import RequestSequence, Scenario, arrival_times, schedule_digest
from services.workload import TRAFFIC_MIX, WorkloadItem

# the default overload: a batch flood on top of people's chats. At --load 3 the interactive and
# critical chats ask 0.75x of the capacity and the batch chats 2.25x, so a mesh that keeps its
# capacity for people answers them all while batch absorbs the refusals
PRIORITY_MIX: Mapping[str, float] = {"interactive": 0.2, "batch": 0.75, "critical": 0.05}
UNLOADED_CLIENTS = 2
RAMP_START_RPS = 2.0
RAMP_FACTOR = 2.0
RAMP_STEP_S = 2.0
SETTLE_S = 1.0  # between phases: chats a closed loop cancelled leave the tiers
MAX_IN_FLIGHT = 2048  # the generator's own cap: far over what the router admits (max_inflight)
NO_KEYS = (
    "not measured: the bench's mesh runs without API keys (--keys 0, or --router), and the "
    "router's fair share (FAIR_SHARE) is per key"
)
KEYS_NOTE = (
    "{n} API keys over TLS: each key's share of the offered rate, its chats sent, answered and "
    "stepped down (of its sent), refused by reason"
)


def parse_priority_mix(text: str) -> dict[str, float]:
    """`--priority-mix interactive=0.2,batch=0.75,critical=0.05`: each priority's share of the
    overload's chats (normalised to 1; a priority left out sends none). ValueError naming what
    is wrong."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in PRIORITY_MIX:
            raise ValueError(
                f"--priority-mix: {name!r} is not a priority ({', '.join(PRIORITY_MIX)})"
            )
        if name in mix:
            raise ValueError(f"--priority-mix: {name} given twice")
        try:
            value = float(share)
        except ValueError:
            raise ValueError(f"--priority-mix: {name}={share!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"--priority-mix: {name}={share} must be a share >= 0")
        mix[name] = value
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"--priority-mix: {text!r} gives no priority a share above 0")
    return {name: round(value / total, 6) for name, value in mix.items() if value > 0}


def priority_of(seed: int, mix: Mapping[str, float] = PRIORITY_MIX) -> Callable[[int], str]:
    """The priority of request i: drawn by the mix from a generator seeded by (seed, i), so it
    is the same in every run whatever else changes."""
    names = list(mix)
    weights = [mix[n] for n in names]

    def pick(index: int) -> str:
        return random.Random(f"priority:{seed}:{index}").choices(names, weights)[0]

    return pick


def next_rate(served: Sequence[float], refused: Sequence[float], factor: float) -> float:
    """The ramp's next rate: `factor` times the highest served so far until a rate is not
    served, then the geometric middle between the highest served and the lowest not served."""
    if not refused:
        return max(served) * factor
    low = max(served, default=min(refused) / factor**2)
    return math.sqrt(low * min(refused))


class Strided:
    """Every stride-th request of a sequence: request k is the sequence's k * stride."""

    def __init__(self, sequence: RequestSequence, stride: int) -> None:
        self.sequence, self.stride = sequence, stride

    def __getitem__(self, index: int) -> WorkloadItem:
        return self.sequence[index * self.stride]


def unloaded_stride(requests: int, chat_s: float | None, unloaded_s: float) -> int:
    """The stride that spreads the unloaded pass (UNLOADED_CLIENTS closed-loop clients for
    unloaded_s, chats of about chat_s) over `requests` requests."""
    expected = UNLOADED_CLIENTS * unloaded_s / max(chat_s or 0.0, 0.001)
    return max(1, int(requests / expected))


def answered_rate(records: Sequence[RequestRecord]) -> float | None:
    """Chats answered per second from the first sent to the last answered: past capacity, the
    rate the mesh serves (a short step's excess waits in the tiers' queues and is answered
    later, so every chat of it may be answered, at this rate)."""
    answered = [r for r in records if r.ok and r.finished_at_s is not None]
    if not answered:
        return None
    span = max(r.finished_at_s or 0.0 for r in answered) - min(r.sent_at_s for r in records)
    return round(len(answered) / span, 3) if span > 0 else None


def capacity_of(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The highest rate served, but no more than the highest rate the mesh answered at in a
    step it did not serve (a queue that absorbed a short step hides the excess)."""
    served = [row["rate_rps"] for row in rows if row["served"]]
    answering = [row["answered_rps"] for row in rows if not row["served"] and row["answered_rps"]]
    if not served:
        return None
    return round(float(min(max(served), max(answering, default=max(served)))), 3)


def capacity_step_ok(
    records: Sequence[RequestRecord], ttft_bound_ms: float
) -> tuple[bool, dict[str, Any]]:
    """Whether one ramp step was served: every chat answered, none stepped down, TTFT p99
    within the bound; and the step's numbers."""
    answered = [r for r in records if r.ok]
    p99 = latency(records)["ttft_ms"]["p99"]
    stepped = sum(1 for r in records if r.stepped_from)
    ok = bool(records) and len(answered) == len(records) and not stepped
    ok = ok and p99 is not None and p99 <= ttft_bound_ms
    return ok, {
        "sent": len(records),
        "answered": len(answered),
        "answered_rps": answered_rate(records),
        "stepped_down": stepped,
        "ttft_ms_p99": p99,
    }


async def find_capacity(
    client: AsyncRouterClient,
    sequence: RequestSequence,
    load: LoadOptions,
    *,
    budget_s: float,
    ttft_bound_ms: float,
    seed: int,
    start_rps: float = RAMP_START_RPS,
    factor: float = RAMP_FACTOR,
    step_s: float = RAMP_STEP_S,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The open-loop ramp: step_s of routed interactive chats at each rate (budget_s of steps
    in all), from start_rps, each step's rate next_rate's; capacity_rps is the highest rate
    served, with the steps and a warning when it is only a bound."""
    steps = max(1, int(budget_s // step_s))
    served: list[float] = []
    answered: list[RequestRecord] = []
    refused: list[float] = []
    rows: list[dict[str, Any]] = []
    rate = start_rps
    for k in range(steps):
        scenario = Scenario("capacity", "constant", rate, step_s, 0.0, TRAFFIC_MIX, seed + k)
        run = LoadRun(client, CONFIGURATIONS["hybrid"], load.max_tokens, load.timeout_s)
        records = await run_open_loop(run, arrival_times(scenario), sequence, MAX_IN_FLIGHT)
        ok, row = capacity_step_ok(records, ttft_bound_ms)
        if k == 0:  # the lowest rate: the chats' length nearest to unloaded
            answered = [r for r in records if r.ok]
        rows.append({"rate_rps": round(rate, 3), "served": ok, **row})
        if progress is not None:
            progress(f"capacity ramp: {rate:.3g} req/s {'served' if ok else 'not served'}")
        (served if ok else refused).append(rate)
        if not ok and row["answered_rps"]:  # the next steps look below what it answered at
            refused.append(row["answered_rps"])
        await asyncio.sleep(SETTLE_S)
        rate = next_rate(served, refused, factor)
    capacity = capacity_of(rows)
    chats_s = [r.final_s for r in answered if r.final_s is not None]
    warnings = []
    if capacity is None:
        capacity = round(min(refused), 3)
        warnings.append(
            f"no ramp step was served: capacity taken as the lowest rate tried, {capacity:g} "
            "req/s, an upper bound"
        )
    elif not refused:
        warnings.append(
            f"every ramp step was served: capacity {capacity:g} req/s is a lower "
            "bound (a longer --capacity-s ramps higher)"
        )
    return {
        "capacity_rps": capacity,
        # a chat's mean length in the ramp's first step: sizes the unloaded pass's stride
        "chat_s": round(sum(chats_s) / len(chats_s), 4) if chats_s else None,
        "ramp": rows,
        "warnings": warnings,
    }


async def run_overload(
    target: MeshTarget,
    *,
    load_x: float,
    duration_s: float,
    seed: int,
    load: LoadOptions,
    capacity_s: float,
    unloaded_s: float,
    ttft_bound_ms: float,
    progress: Callable[[str], None] | None = None,
    keys: BenchKeys | None = None,
    priority: str | None = None,
    priority_mix: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The three phases; returns the report object. With `keys` (the mesh enforces them) the
    overload's chats are sent under them by their rates, else with no key; with `priority`
    every overload chat has it, else `priority_mix` (default PRIORITY_MIX) draws each one's."""
    if load_x <= 0 or duration_s <= 0 or capacity_s <= 0 or unloaded_s <= 0:
        raise BenchError("--load, --duration, --capacity-s and --unloaded-s must be > 0")
    say = progress or (lambda _text: None)
    sequence = RequestSequence(TRAFFIC_MIX, seed)
    hybrid = CONFIGURATIONS["hybrid"]
    mix = {priority: 1.0} if priority else dict(priority_mix or PRIORITY_MIX)
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, AsyncRouterClient] = {}
        for name in keys.rates if keys is not None else ("",):
            opened = keys.client(target.router, name) if keys else AsyncRouterClient(target.router)
            clients[name] = await stack.enter_async_context(opened)
        client = next(iter(clients.values()))  # the first key's: the ramp and unloaded pass
        capacity = await find_capacity(
            client,
            sequence,
            load,
            budget_s=capacity_s,
            ttft_bound_ms=ttft_bound_ms,
            seed=seed + 1000,
            progress=say,
        )
        await asyncio.sleep(SETTLE_S)
        rate = capacity["capacity_rps"] * load_x
        scenario = Scenario("overload", "constant", rate, duration_s, 0.0, TRAFFIC_MIX, seed)
        arrivals = arrival_times(scenario)
        stride = unloaded_stride(len(arrivals), capacity["chat_s"], unloaded_s)
        say(f"unloaded pass: {UNLOADED_CLIENTS} clients for {unloaded_s:g} s, every {stride}th")
        run = LoadRun(client, hybrid, load.max_tokens, load.timeout_s)
        strided = cast(RequestSequence, Strided(sequence, stride))
        unloaded = await run_closed_loop(run, strided, UNLOADED_CLIENTS, unloaded_s)
        for record in unloaded:  # request k of the pass is request k * stride of the sequence
            record.index *= stride
        await asyncio.sleep(SETTLE_S)
        say(
            f"overload: {load_x:g} x {capacity['capacity_rps']:g} = {rate:g} req/s for "
            f"{duration_s:g} s ({len(arrivals)} chats)"
        )
        run = LoadRun(client, hybrid, load.max_tokens, load.timeout_s)
        run.priority_of = priority_of(seed, mix)
        if keys is not None:
            run.key_of, run.key_clients = key_of(seed, keys.rates), clients
        records = await run_open_loop(run, arrivals, sequence, MAX_IN_FLIGHT)
    items: dict[str, WorkloadItem] = {
        sequence[r.index].id: sequence[r.index] for r in (*records, *unloaded)
    }
    summary = overload_summary(records, unloaded, items, keys.rates if keys else None)
    report: dict[str, Any] = {
        "benchmark": "overload",
        "version": 1,
        "capacity_rps": capacity["capacity_rps"],
        "load": load_x,
        "rate_rps": round(rate, 3),
        "duration_s": duration_s,
        # what the mesh answered under the overload, against the ramp's capacity_rps
        "answered_rps": round(sum(1 for r in records if r.ok) / duration_s, 3),
        **{k: v for k, v in summary.items()},
        "per_key_share_note": KEYS_NOTE.format(n=len(keys.rates)) if keys else NO_KEYS,
        "targets": targets(summary),
        "scenario": {
            "mix": dict(TRAFFIC_MIX),
            "priority_mix": mix,
            # each API key's share of the offered rate, by name (None: no keys)
            "key_rates": {k: round(v, 4) for k, v in keys.rates.items()} if keys else None,
            "seed": seed,
            "requests_scheduled": len(arrivals),
            "schedule_digest": schedule_digest(arrivals, sequence),
            "max_tokens": load.max_tokens,
            "timeout_s": load.timeout_s,
            "unloaded_clients": UNLOADED_CLIENTS,
            "unloaded_s": unloaded_s,
            "unloaded_stride": stride,
            "capacity_ttft_bound_ms": ttft_bound_ms,
        },
        "capacity": capacity,
        "mesh": mesh_json(target),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "warnings": capacity["warnings"],
    }
    return report
