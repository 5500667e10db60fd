"""`tiermesh bench --scenario drift`: routing when the traffic changes, live through the router.

A seeded stream of routed chats whose class mix changes midway (drift_summary.py: complex orders
from one in ten to four in ten) is sent in order by a few closed-loop clients, once per routing
policy (the router restarted on each, the learning one cold); after each answer the bench scores
it with the workload's scorer and sends the router's Feedback RPC with that score, as a user's
thumbs up or down would. The report gives, per policy, accuracy and cost over the requests before
and after the change, and each policy against the first on the same requests.

The load generator is loadgen.py's; the numbers are drift_summary.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from tiermesh.client import AsyncRouterClient

from services.bench.drift_summary import (
    AFTER_MIX,
    AFTER_REQUESTS,
    BEFORE_MIX,
    BEFORE_REQUESTS,
    after_scores,
    compared,
    drift_items,
    policy_summary,
)
from services.bench.hybrid_bench import BenchError, LoadOptions, MeshTarget, mesh_json
from services.bench.loadgen import POLICY_PREFIX, LoadRun, RequestRecord, configuration
from services.bench.metrics import RequestScores
from services.common.config import RouterConfig
from services.common.config_loading import load_config
from services.common.errors import ConfigError
from services.workload import WorkloadItem, score

# the router's shipped config: its tier costs price the answers
ROUTER_CONFIG = Path(__file__).resolve().parent.parent / "router" / "config.toml"

DRIFT = "drift"  # the scenario's name in `tiermesh bench --scenario`
DEFAULT_POLICIES = ("adaptive", "cost_target")  # the learning policy and the shipped static one
CLIENTS = 4  # closed-loop clients: the stream stays in order within a few requests


def add_drift_options(bench: argparse.ArgumentParser) -> None:
    """The options only `--scenario drift` reads."""
    group = bench.add_argument_group("--scenario drift")
    group.add_argument(
        "--drift-before", type=int, default=BEFORE_REQUESTS, metavar="N", help="before the change"
    )
    group.add_argument(
        "--drift-after", type=int, default=AFTER_REQUESTS, metavar="N", help="after the change"
    )
    group.add_argument(
        "--drift-policies",
        default=",".join(DEFAULT_POLICIES),
        help="routing policies, each on the same stream; the others are compared with the first",
    )
    group.add_argument(
        "--drift-clients", type=int, default=CLIENTS, metavar="N", help="closed-loop clients"
    )


async def _send_all(
    run: LoadRun, items: Sequence[WorkloadItem], clients: int
) -> tuple[list[RequestRecord], dict[str, int]]:
    """Every item in order by `clients` closed-loop clients; after each answer its score goes
    back as Feedback. Returns the records and the Feedback counts (sent, accepted)."""
    records: list[RequestRecord] = []
    feedback = {"sent": 0, "accepted": 0}
    position = iter(range(len(items)))

    async def client_loop() -> None:
        for index in position:
            item = items[index]
            record = RequestRecord(index, item.id, item.request_class, run.now())
            await run.send(record, item)
            records.append(record)
            if record.ok:
                request_id = f"bench-{run.configuration.name}-{index}"
                feedback["sent"] += 1
                if await run.client.feedback(request_id, float(score(item, record.text))):
                    feedback["accepted"] += 1

    await asyncio.gather(*(client_loop() for _ in range(clients)))
    return records, feedback


async def run_drift(
    target: MeshTarget,
    policies: Sequence[str],
    items: Sequence[WorkloadItem],
    change_at: int,
    load: LoadOptions,
    clients: int,
    costs: dict[str, float],
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The stream through the router once per policy; returns the report object."""
    plan = [configuration(f"{POLICY_PREFIX}{policy}") for policy in policies]
    target.check_policies(plan)
    by_id = {item.id: item for item in items}
    summaries: dict[str, dict[str, Any]] = {}
    scores: dict[str, RequestScores] = {}
    for config in plan:
        await asyncio.to_thread(target.use_policy, config.policy)
        progress(f"{config.policy}: {len(items)} chats, the mix changes after {change_at}")
        async with AsyncRouterClient(target.router) as client:
            run = LoadRun(client, config, load.max_tokens, load.timeout_s)
            records, feedback = await _send_all(run, items, clients)
        summaries[config.policy] = policy_summary(records, by_id, change_at, costs, feedback)
        scores[config.policy] = after_scores(records, by_id, change_at)
    return {
        "benchmark": "routing_drift",
        "version": 1,
        "scenario": {
            "name": DRIFT,
            "before_mix": dict(BEFORE_MIX),
            "after_mix": dict(AFTER_MIX),
            "before_requests": change_at,
            "after_requests": len(items) - change_at,
            "clients": clients,
            "max_tokens": load.max_tokens,
            "timeout_s": load.timeout_s,
            "feedback": "the workload's scorer on each answer (1 right, 0 wrong)",
        },
        "tier_costs": costs,
        "policies": summaries,
        "compared": compared(scores, summaries),
        "mesh": mesh_json(target),
        "machine": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
    }


def _interval(bounds: Sequence[float] | None) -> str:
    return "" if not bounds else f" [{bounds[0]:.3f}-{bounds[1]:.3f}]"


def drift_table(report: dict[str, Any]) -> Table:
    table = Table(title="routing drift: after the change (before in brackets)")
    for column in ("policy", "accuracy", "tier cost vs large", "answered by", "feedback"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, summary in report["policies"].items():
        after, before = summary["after"], summary["before"]
        tiers = ", ".join(f"{t} {n}" for t, n in after["answered_by"].items())
        table.add_row(
            name,
            f"{after['accuracy']}{_interval(after['accuracy_ci95'])} ({before['accuracy']})",
            f"{after['tier_cost_vs_large']} ({before['tier_cost_vs_large']})",
            tiers,
            f"{summary['feedback']['accepted']} of {summary['feedback']['sent']} applied",
        )
    return table


def run_drift_command(args: argparse.Namespace, console: Console, mesh: Callable[[], Any]) -> int:
    """`tiermesh bench --scenario drift`; `mesh()` gives the target (a context manager)."""
    try:
        policies = [p for p in args.drift_policies.split(",") if p]
        for policy in policies:
            configuration(f"{POLICY_PREFIX}{policy}")
        if args.drift_before < 0 or args.drift_after < 1 or args.drift_clients < 1:
            raise BenchError("--drift-before >= 0, --drift-after >= 1, --drift-clients >= 1")
        items = drift_items(args.drift_before, args.drift_after, args.seed)
        costs = dict(load_config(RouterConfig, ROUTER_CONFIG).tier_costs)
        load = LoadOptions(max_tokens=args.max_tokens, timeout_s=args.timeout)
        with mesh() as target:
            report = asyncio.run(
                run_drift(
                    target,
                    policies,
                    items,
                    args.drift_before,
                    load,
                    args.drift_clients,
                    costs,
                    lambda line: console.print(line),
                )
            )
    except (BenchError, ConfigError, ValueError) as e:
        console.print(f"[red]bench: {e}[/red]")
        return 2
    report["scenario"]["seed"] = args.seed
    console.print(drift_table(report))
    if args.json:
        print(json.dumps(report))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0
