"""The batch scheduler's step planner (services/tier/step_planner.py) as tables of scenarios,
without torch: one step planned from plain data the way the scheduler drives it (ask, carry the
plan out, ask again after each prefill pass with the requests that arrived during it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from services.tier.queue_order import RANK
from services.tier.step_planner import (
    CRITICAL_RANK,
    RowStatus,
    RunningRow,
    SchedulerState,
    StepPlan,
    StepProgress,
    WaitingRequest,
    plan_step,
    take_within_budget,
)

DECODING, STOPPED, ENDED = RowStatus.DECODING, RowStatus.STOPPED, RowStatus.ENDED
PAUSED = RowStatus.PAUSED


def waiting(
    name: str, tokens: int, stopped: bool = False, rank: int = 1, paused: bool = False
) -> WaitingRequest:
    """A waiting request named by one letter (its slot follows from the letter); rank 0 is a
    critical request, 1 interactive, 2 batch."""
    return WaitingRequest(
        slot=ord(name),
        prompt_tokens=tokens,
        request_id=name,
        stopped=stopped,
        rank=rank,
        paused=paused,
    )


def row(name: str, status: RowStatus = DECODING) -> RunningRow:
    return RunningRow(slot=ord(name), status=status, request_id=name)


def describe(plan: StepPlan) -> str:
    """A plan in a few words: "free c; evict b; drop d; prefill a e", "decode a b", "wait"."""
    parts = [
        f"{what} {' '.join(r.request_id for r in rows)}"
        for what, rows in (
            ("free", plan.free),
            ("evict", plan.evict),
            ("drop", plan.drop),
            ("prefill", plan.prefill),
            ("decode", plan.decode),
        )
        if rows
    ]
    return "; ".join(parts + (["wait"] if plan.wait else []))


@dataclass(frozen=True)
class Scenario:
    name: str
    plans: tuple[str, ...]  # what one step does, plan by plan (describe())
    budget: int = 512
    waiting: tuple[WaitingRequest, ...] = ()  # at the step's start, in arrival order
    running: tuple[RunningRow, ...] = ()
    arrivals: tuple[tuple[WaitingRequest, ...], ...] = ()  # during the 1st, 2nd, ... prefill pass
    end_at_prefill: frozenset[str] = frozenset()  # their first token finishes them
    left: str = ""  # still waiting when the step ends


def plan_one_step(scenario: Scenario) -> tuple[list[str], str]:
    """The step's plans, each carried out on plain data as the scheduler does, and the requests
    still waiting after it."""
    queue, rows = list(scenario.waiting), list(scenario.running)
    arrivals = list(scenario.arrivals)
    plans: list[str] = []
    plan = StepPlan(resume=StepProgress())  # a step begins
    while plan.resume is not None:
        state = SchedulerState(scenario.budget, tuple(queue), tuple(rows), plan.resume)
        plan = plan_step(state)
        plans.append(describe(plan))
        gone = {r.slot for r in (*plan.free, *plan.evict)}
        taken = {w.slot for w in (*plan.drop, *plan.prefill)}
        rows = [r for r in rows if r.slot not in gone]
        queue = [w for w in queue if w.slot not in taken]
        for w in plan.prefill:
            ends = w.request_id in scenario.end_at_prefill
            rows.append(row(w.request_id, ENDED if ends else DECODING))
        if plan.prefill and arrivals:
            queue += arrivals.pop(0)
    return plans, " ".join(w.request_id for w in queue)


SCENARIOS = [
    Scenario("empty: wait for an arrival", ("wait",)),
    Scenario(
        "a row paused for a critical request sits out: neither decoded nor freed",
        ("decode x z",),
        running=(row("x"), row("y", PAUSED), row("z")),
    ),
    Scenario(
        "only paused rows: wait (for an arrival, or their resume)",
        ("wait",),
        running=(row("y", PAUSED),),
    ),
    Scenario(
        "a paused waiting request is not prefilled; one its caller stopped is dropped",
        ("drop c; prefill b", "decode b"),
        waiting=(
            waiting("a", 5, rank=2, paused=True),
            waiting("b", 5),
            waiting("c", 5, True, 2, True),
        ),
        left="a",
    ),
    Scenario("one request", ("prefill a", "decode a"), waiting=(waiting("a", 5),)),
    Scenario(
        "a burst under the budget is prefilled in one pass",
        ("prefill a b c", "decode a b c"),
        waiting=(waiting("a", 100), waiting("b", 100), waiting("c", 100)),
    ),
    Scenario(
        "a burst over the budget: taken while the tokens before each are under it",
        ("prefill a b c", "decode a b c"),
        budget=10,
        waiting=(waiting("a", 4), waiting("b", 4), waiting("c", 4), waiting("d", 4)),
        left="d",
    ),
    Scenario(
        "a prompt longer than the budget is still taken, alone",
        ("prefill a", "decode a"),
        budget=10,
        waiting=(waiting("a", 50), waiting("b", 1)),
        left="b",
    ),
    Scenario(
        "a burst that exactly spends the budget leaves the next one waiting",
        ("prefill a b", "decode a b"),
        budget=10,
        waiting=(waiting("a", 5), waiting("b", 5), waiting("c", 1)),
        left="c",
    ),
    Scenario("running rows decode", ("decode x y",), running=(row("x"), row("y"))),
    Scenario(
        "a request joins the running rows before their decode",
        ("prefill a", "decode x a"),
        waiting=(waiting("a", 5),),
        running=(row("x"),),
    ),
    Scenario(
        "arrivals during a prefill pass are prefilled before the decode",
        ("prefill a", "prefill b c", "decode x a b c"),
        waiting=(waiting("a", 5),),
        running=(row("x"),),
        arrivals=((waiting("b", 5), waiting("c", 5)),),
    ),
    Scenario(
        "arrivals during each pass, pass after pass",
        ("prefill a", "prefill b", "prefill c", "decode a b c"),
        waiting=(waiting("a", 5),),
        arrivals=((waiting("b", 5),), (waiting("c", 5),)),
    ),
    Scenario(
        "the budget is counted once for the whole step",  # counted twice: b would wait
        ("prefill a", "prefill b", "prefill c", "decode a b c"),
        budget=10,
        waiting=(waiting("a", 6),),
        arrivals=((waiting("b", 3),), (waiting("c", 1),), (waiting("d", 1),)),
        left="d",
    ),
    Scenario(
        "a budget spent by the first pass leaves the arrivals for the next step",
        ("prefill a", "decode a"),
        budget=10,
        waiting=(waiting("a", 10),),
        arrivals=((waiting("b", 1),),),
        left="b",
    ),
    Scenario(
        "at most one prompt past the budget over the step",
        ("prefill a", "prefill b", "decode a b"),
        budget=10,
        waiting=(waiting("a", 6),),
        arrivals=((waiting("b", 6), waiting("c", 1)),),
        left="c",
    ),
    Scenario(
        "stopped rows leave and ended rows are freed at the step's start",
        ("free z; evict y; decode x",),
        running=(row("x"), row("y", STOPPED), row("z", ENDED)),
    ),
    Scenario(
        "the last rows leave: wait for an arrival",
        ("free z; evict y; wait",),
        running=(row("y", STOPPED), row("z", ENDED)),
    ),
    Scenario(
        "a request finished by its first token is freed before the decode",
        ("prefill a b", "free b; decode a"),
        waiting=(waiting("a", 5), waiting("b", 5)),
        end_at_prefill=frozenset("b"),
    ),
    Scenario(
        "every prefilled request finished: wait for an arrival",
        ("prefill a", "free a; wait"),
        waiting=(waiting("a", 5),),
        end_at_prefill=frozenset("a"),
    ),
    Scenario(
        "requests stopped while waiting are dropped, their tokens counted as taken",
        ("drop b; prefill a c", "decode a c"),
        budget=10,
        waiting=(waiting("a", 4), waiting("b", 4, stopped=True), waiting("c", 4), waiting("d", 1)),
        left="d",
    ),
    Scenario(
        "a critical request is prefilled first, alone, then the others within the budget left",
        ("prefill c", "prefill a", "decode x c a"),
        budget=10,
        waiting=(waiting("a", 4), waiting("b", 4, rank=2), waiting("c", 8, rank=0)),
        running=(row("x"),),
        left="b",
    ),
    Scenario(
        "a critical request arriving during a prefill pass goes first in the next pass",
        ("prefill a", "prefill d", "prefill b", "decode a d b"),
        budget=20,
        waiting=(waiting("a", 4),),
        arrivals=((waiting("b", 4, rank=2), waiting("d", 4, rank=0)),),
    ),
    Scenario(
        "critical requests share their pass with each other only",
        ("prefill c d", "prefill a", "decode c d a"),
        waiting=(waiting("a", 4), waiting("c", 4, rank=0), waiting("d", 4, rank=0)),
    ),
    Scenario(
        "batch requests wait behind interactive ones that arrived after them",
        ("prefill b", "decode x b"),
        budget=5,
        waiting=(waiting("a", 4, rank=2), waiting("b", 6)),
        running=(row("x"),),
        left="a",
    ),
    Scenario(
        "past the budget with nothing to decode, the step ends: the rest wait for the next",
        ("prefill a", "free a"),
        budget=10,
        waiting=(waiting("a", 20), waiting("b", 1)),
        end_at_prefill=frozenset("a"),
        left="b",
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_one_step(scenario: Scenario) -> None:
    assert plan_one_step(scenario) == (list(scenario.plans), scenario.left)


def test_the_critical_rank_is_the_tier_queues_critical_rank() -> None:
    assert CRITICAL_RANK == RANK["critical"] == min(RANK.values())


def test_rows_stopped_during_a_prefill_pass_decode_once_more_and_leave_next_step() -> None:
    after_pass = StepProgress(after_prefill=True, prompt_tokens=5)
    rows = (row("x", STOPPED), row("a"))
    plan = plan_step(SchedulerState(512, running=rows, progress=after_pass))
    assert describe(plan) == "decode x a" and plan.resume is None
    assert describe(plan_step(SchedulerState(512, running=rows))) == "evict x; decode a"


def test_a_prefill_plan_resumes_with_the_tokens_taken_and_a_decode_plan_ends_the_step() -> None:
    state = SchedulerState(10, waiting=(waiting("a", 3), waiting("b", 4)))
    plan = plan_step(state)
    assert plan.resume == StepProgress(after_prefill=True, prompt_tokens=7)
    resumed = plan_step(SchedulerState(10, running=(row("a"), row("b")), progress=plan.resume))
    assert describe(resumed) == "decode a b" and resumed.resume is None


@pytest.mark.parametrize(
    ("tokens", "room", "taken"),
    [
        ((), 10, 0),
        ((3, 3, 3), 0, 0),
        ((3, 3, 3), -2, 0),
        ((30,), 1, 1),
        ((3, 3, 3, 3), 10, 4),
        ((3, 3, 3, 3), 9, 3),
        ((5, 5, 5), 10, 2),
    ],
)
def test_take_within_budget(tokens: tuple[int, ...], room: int, taken: int) -> None:
    queue = tuple(waiting(chr(ord("a") + i), t) for i, t in enumerate(tokens))
    assert take_within_budget(queue, room) == queue[:taken]


@pytest.mark.parametrize("seed", range(40))
def test_any_burst_keeps_the_budget_rules(seed: int) -> None:
    """Random bursts and arrivals: the first pass takes at least one request, each pass takes
    the oldest waiting in arrival order, and the step goes at most one prompt past the budget."""
    rng = random.Random(seed)
    names = iter("abcdefghijklmnopqrstuvwxyz")
    burst = tuple(waiting(next(names), rng.randint(1, 40)) for _ in range(rng.randint(1, 6)))
    arrivals = tuple(
        tuple(waiting(next(names), rng.randint(1, 40)) for _ in range(rng.randint(0, 3)))
        for _ in range(4)
    )
    scenario = Scenario("random", (), budget=rng.randint(1, 100), waiting=burst, arrivals=arrivals)
    plans, _ = plan_one_step(scenario)
    groups = [p.removeprefix("prefill ").split() for p in plans if p.startswith("prefill")]
    assert groups and groups[0][0] == "a"
    order = [w.request_id for w in (*burst, *(w for a in arrivals for w in a))]
    taken = [name for group in groups for name in group]
    assert taken == sorted(taken, key=order.index)  # oldest first, none skipped ahead
    tokens = {w.request_id: w.prompt_tokens for w in (*burst, *(w for a in arrivals for w in a))}
    spent = sum(tokens[name] for name in taken)
    assert spent - tokens[taken[-1]] < scenario.budget  # the last one started under the budget
    assert plans[-1].startswith("decode")
