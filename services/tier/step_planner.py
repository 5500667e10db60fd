"""Plans each step of the batch scheduler as a pure function, knowing no torch, threads, queues
or clocks: from the scheduler's state as plain data (the requests waiting, the running rows, how
far the step has got) to its next plan: which rows leave and free their slots, which waiting
requests are prefilled together, which rows decode.

The scheduler (batch_scheduler.py) builds the state, asks plan_step() and carries the plan out.
A step runs prefill passes, then one decode pass:

1. Rows whose stream ended (finished or failed) free their slots, at every plan. At the step's
   start, rows their caller stopped leave (their stream is closed, their slot freed); a row
   stopped later in the step decodes once more and leaves at the next step's start.
2. The requests waiting then, by priority (a critical request before an interactive one, an
   interactive one before batch: each one's `rank`) and within a priority in arrival order, are
   taken while the step's prefill budget lasts:
   a request is taken while the prompt tokens taken before it in this step are under the budget,
   so at least one is taken and the step goes at most one prompt past the budget. Those taken
   are prefilled together in one forward pass (any stopped meanwhile are dropped instead; their
   tokens count all the same). Critical requests have a pass of their own: their first tokens
   wait for no other prompt (the others follow in the next pass, within the same budget).
3. After that pass the scheduler asks again, with the requests that arrived during it and the
   tokens taken so far: the budget is counted once for the whole step, across its passes. They
   are prefilled in another pass while the budget lasts, and so on.
4. When no more is to be prefilled, every running row decodes one token, together; that ends the
   step (requests still waiting then start the next). With nothing running and nothing waiting,
   the plan is to wait for an arrival.

A request paused for a critical one (admission.py) sits out: a paused row is neither decoded nor
freed (it keeps its slot and goes on where it was once resumed), a paused waiting request is not
prefilled; one whose caller stopped it leaves all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

CRITICAL_RANK = 0  # a critical request's rank (queue_order.RANK["critical"])


class RowStatus(Enum):
    """Where a running row stands, as the scheduler last saw it."""

    DECODING = "decoding"  # it goes on: one token a step
    PAUSED = "paused"  # paused for a critical request: it sits out, keeping its slot
    STOPPED = "stopped"  # its caller stopped it (left, aborted, or the engine is closing)
    ENDED = "ended"  # its stream has ended (finished or failed): only its slot is left to free


@dataclass(frozen=True)
class WaitingRequest:
    """A request submitted to the scheduler, not prefilled yet; its pool slot is reserved."""

    slot: int  # its KV-pool slot: the scheduler's key for it
    prompt_tokens: int  # its prompt's length: what its prefill costs the step's budget
    request_id: str = ""  # for observers and logs; never used to decide
    stopped: bool = False  # its caller stopped it before its prefill
    rank: int = 1  # its priority's place (queue_order.RANK): lower is prefilled first
    paused: bool = False  # paused for a critical request: not prefilled until resumed


@dataclass(frozen=True)
class RunningRow:
    """A request that has been prefilled and holds a row of the decode batch."""

    slot: int
    status: RowStatus = RowStatus.DECODING
    request_id: str = ""


@dataclass(frozen=True)
class StepProgress:
    """How far the current step has got: what plan_step() needs to go on with it."""

    after_prefill: bool = False  # a prefill group of this step has been taken (and run)
    prompt_tokens: int = 0  # prompt tokens taken for prefill in this step so far


@dataclass(frozen=True)
class SchedulerState:
    """The scheduler between two passes, as plain data."""

    budget: int  # prompt tokens prefilled per step (prefill_tokens_per_step, >= 1)
    waiting: tuple[WaitingRequest, ...] = ()  # in arrival order
    running: tuple[RunningRow, ...] = ()  # in decode-row order
    progress: StepProgress = StepProgress()  # StepProgress(): a step begins


@dataclass(frozen=True)
class StepPlan:
    """What the scheduler does next, in this order: free, evict, drop, then one forward pass
    (prefill or decode) or a wait for an arrival. `resume` is where planning goes on within this
    step once the pass has run; None when this plan ends the step."""

    free: tuple[RunningRow, ...] = ()  # ended rows: free their slots
    evict: tuple[RunningRow, ...] = ()  # stopped rows: close their streams, free their slots
    drop: tuple[WaitingRequest, ...] = ()  # taken but stopped: close their streams, free slots
    prefill: tuple[WaitingRequest, ...] = ()  # prefilled together in one forward pass
    decode: tuple[RunningRow, ...] = ()  # each decodes one token, in one forward pass
    wait: bool = False  # nothing to run: wait (briefly) for an arrival
    resume: StepProgress | None = None


def plan_step(state: SchedulerState) -> StepPlan:
    """The next plan of the step `state.progress` describes (see the module's steps)."""
    progress = state.progress
    free = _with(state.running, RowStatus.ENDED)
    evict = () if progress.after_prefill else _with(state.running, RowStatus.STOPPED)
    left = {row.slot for row in (*free, *evict)}
    rows = tuple(r for r in state.running if r.slot not in left)
    ready = (w for w in state.waiting if w.stopped or not w.paused)
    by_priority = tuple(sorted(ready, key=lambda w: w.rank))  # stable: arrival order
    if by_priority and by_priority[0].rank == CRITICAL_RANK:  # their pass carries them alone
        by_priority = tuple(w for w in by_priority if w.rank == CRITICAL_RANK)
    group = take_within_budget(by_priority, state.budget - progress.prompt_tokens)
    if group:
        taken = progress.prompt_tokens + sum(w.prompt_tokens for w in group)
        return StepPlan(
            free=free,
            evict=evict,
            drop=tuple(w for w in group if w.stopped),
            prefill=tuple(w for w in group if not w.stopped),
            resume=StepProgress(after_prefill=True, prompt_tokens=taken),
        )
    decode = tuple(r for r in rows if r.status is not RowStatus.PAUSED)
    wait = not decode and not by_priority
    return StepPlan(free=free, evict=evict, decode=decode, wait=wait)


def take_within_budget(
    waiting: tuple[WaitingRequest, ...], room: int
) -> tuple[WaitingRequest, ...]:
    """The leading requests of `waiting` taken while the prompt tokens taken before each are
    under `room`: none when `room` <= 0, else at least one (when any waits), and at most one
    prompt past `room`."""
    taken: list[WaitingRequest] = []
    for request in waiting:
        if room <= 0:
            break
        taken.append(request)
        room -= request.prompt_tokens
    return tuple(taken)


def _with(rows: tuple[RunningRow, ...], status: RowStatus) -> tuple[RunningRow, ...]:
    return tuple(row for row in rows if row.status is status)
