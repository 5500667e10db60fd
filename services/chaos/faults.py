"""The faults `tiermesh chaos` knows and the schedule it injects them on: which fault, on which
service, at which second of the run. Pure and seeded-free (the schedule is a plain rotation, so
the same options always give the same schedule); knows nothing of processes or gRPC.

| kind          | what is done                                                  | target          |
| ------------- | ------------------------------------------------------------- | --------------- |
| kill-tier     | SIGKILL every process of a tier, mid-stream                   | a tier          |
| kill-replica  | SIGKILL one process of a tier that has several                | a replica       |
| hang-tier     | SIGSTOP every process of a tier, SIGCONT after `hold_s`       | a tier          |
| control-plane | SIGKILL the xDS control plane (the supervisor restarts it)    | control-plane   |
| overload      | `hold_s` of arrivals at 3x the scenario's rate                 | router          |
| poison        | requests with invalid sampling, invalid UTF-8, too many tokens | router          |
| slow-reader   | chats opened and never read for `hold_s`, then cancelled      | router          |
| slow-connections | thousands of connections that never finish their request,  | gateway, router |
|               | held for `hold_s` from several processes (slow_connections.py) |                 |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KILL_TIER = "kill-tier"
KILL_REPLICA = "kill-replica"
HANG_TIER = "hang-tier"
CONTROL_PLANE = "control-plane"
OVERLOAD = "overload"
POISON = "poison"
SLOW_READER = "slow-reader"
SLOW_CONNECTIONS = "slow-connections"
FAULT_KINDS = (
    KILL_TIER,
    KILL_REPLICA,
    HANG_TIER,
    CONTROL_PLANE,
    OVERLOAD,
    POISON,
    SLOW_READER,
    SLOW_CONNECTIONS,
)
ROUTER = "router"
GATEWAY = "gateway"
OVERLOAD_FACTOR = 3.0  # an overload burst offers this many times the scenario's rate


class FaultPlanError(ValueError):
    """The faults asked for cannot be injected into this mesh; the message says why."""


@dataclass(frozen=True)
class PlannedFault:
    kind: str
    target: str  # a tier, a replica ("small-2"), "control-plane" or "router"
    at_s: float  # seconds after the load starts


def parse_faults(value: str) -> tuple[str, ...]:
    """`kill-tier,hang-tier` as a tuple of kinds; raises FaultPlanError naming an unknown one."""
    kinds = tuple(part.strip() for part in value.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in FAULT_KINDS]
    if unknown or not kinds:
        raise FaultPlanError(
            f"--faults: unknown {', '.join(unknown) or '(none given)'}; known: "
            f"{', '.join(FAULT_KINDS)}"
        )
    return kinds


def fault_targets(
    kind: str, tiers: Sequence[str], processes: dict[str, list[str]], mesh: bool
) -> list[str]:
    """What a fault of `kind` may hit, in rotation order. `tiers`: the tiers tier faults may
    pick; `processes`: every tier's process names ({"small": ["small", "small-2"]})."""
    if kind in (KILL_TIER, HANG_TIER):
        return list(tiers)
    if kind == KILL_REPLICA:
        replicated = [
            name for tier in tiers if len(processes.get(tier, [])) > 1 for name in processes[tier]
        ]
        if not replicated:
            raise FaultPlanError("kill-replica needs a tier with --replicas TIER=2 or more")
        return replicated
    if kind == CONTROL_PLANE:
        if not mesh:
            raise FaultPlanError("the control-plane fault needs --mesh")
        return [CONTROL_PLANE]
    if kind == SLOW_CONNECTIONS:
        return [GATEWAY, ROUTER]  # half-open HTTP/1.1, then unfinished HTTP/2 prefaces
    return [ROUTER]


def plan_faults(
    kinds: Sequence[str],
    targets: dict[str, list[str]],
    duration_s: float,
    first_at_s: float,
    every_s: float,
    quiet_tail_s: float,
) -> list[PlannedFault]:
    """One fault every `every_s` from `first_at_s`, the kinds in turn and each kind's targets in
    turn, none later than `duration_s - quiet_tail_s` (the end of the run is left to recover)."""
    if every_s <= 0:
        raise FaultPlanError(f"--fault-every: must be > 0, got {every_s}")
    planned: list[PlannedFault] = []
    turns = dict.fromkeys(kinds, 0)
    at = first_at_s
    index = 0
    while at <= duration_s - quiet_tail_s:
        kind = kinds[index % len(kinds)]
        options = targets[kind]
        planned.append(PlannedFault(kind, options[turns[kind] % len(options)], round(at, 3)))
        turns[kind] += 1
        index += 1
        at += every_s
    return planned
