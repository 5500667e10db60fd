"""Bounded admission for a tier: a fixed number of running slots and a bounded wait queue, with
refusals that come at once and say when to retry.

A request is refused at once (QueueRefused, RESOURCE_EXHAUSTED) when both limits are reached,
or when its expected wait for a running slot is longer than it may wait: its deadline, or
`max_wait_s`. The expected wait, which is also the retry delay a refusal carries, is measured:
the requests ahead of it times the mean time between slot hand-overs while requests wait (an
exponential average; before one is measured, the mean time a slot is held over the number of
slots), times a correction from reality: how long queued requests really waited against what was
expected of them (an exponential average of the ratio, never below 1), or, when larger, the
ratio of the oldest request still waiting so far, so a burst that outruns the measured rate is
refused before the queue fills with requests that cannot start in time. A queued request is
then served: it is refused late only if it still waits after `LATE_FACTOR` times its budget
(the estimate was badly wrong), or once 90% of its deadline has passed (so that the refusal,
not DEADLINE_EXCEEDED, reaches the client).

Priorities (queue_order.py): a freed slot goes to the waiting request of the highest priority
(critical, then interactive, then batch), each priority in arrival order, and a request's
expected wait counts only the requests it waits behind. At a full queue a request takes the
place of the newest waiting request of a lower priority, which is refused instead, and a batch
request that finds a critical or interactive one waiting is refused at once rather than queued
to be passed over: under pressure batch absorbs the refusals. Running slots beyond `max_running`
(`critical_reserve`, a share of it) may be kept for critical requests, so one starts at once
while the others fill `max_running`. Where the engine can pause a running request (`pausable`: how
many at once), a critical request that finds every slot taken pauses the newest batch request
running instead of waiting (queue_order.to_pause): the slot holder's `paused` is set, the engine's
loop leaves it out of its batch, and it keeps its place (its KV cache) until a freed slot resumes
it, before anyone waiting but a critical request. Knows nothing of models or gRPC. Not
thread-safe: use from one event loop (the engine's threads only read `SlotHolder.paused`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from services.common.errors import AT_CAPACITY, WAIT_PAST_DEADLINE, Overloaded
from services.tier.queue_order import (
    BATCH,
    CRITICAL,
    INTERACTIVE,
    ahead_of,
    may_queue,
    next_to_start,
    resumes_first,
    to_displace,
    to_pause,
)

MAX_WAIT_S = 5.0  # the longest a request without a shorter deadline is expected to wait
LATE_FACTOR = 2.0  # a queued request is refused after this many times its budget (backstop)
DEADLINE_SHARE = 0.9  # ... or after this share of its deadline, so the refusal beats the deadline
FIRST_HOLD_S = 1.0  # a running slot's assumed hold time until one has been measured
HOLD_WEIGHT = 0.2  # weight of the newest hold time in the running average
HANDOVER_WEIGHT = 0.1  # weight of the newest time between hand-overs in its running average
RATIO_WEIGHT = 0.2  # weight of the newest real / expected wait in its running average
# the correction never goes past these. Never below 1: waits shorter than expected (requests
# that left the queue early) say nothing of how fast the next hand-overs come, and trusting them
# (down to 0.5) queued requests expected at up to twice the budget that then waited past the
# LATE_FACTOR backstop, refused after 10 s instead of at once
RATIO_BOUNDS = (1.0, 4.0)


class QueueRefused(Overloaded):
    """Refused by admission; `retry_after_s` is the queue's expected wait, `reason` one of
    AT_CAPACITY and WAIT_PAST_DEADLINE."""

    def __init__(self, message: str, retry_after_s: float, reason: str = AT_CAPACITY) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.reason = reason


@dataclass(eq=False)
class SlotHolder:
    """A request holding a running slot, as slot() yields it. `paused`: a critical request took
    its running slot for now; it keeps its place (and the engine its KV cache) and leaves the
    batch until it is resumed. Set on the event loop; an engine's thread may read it."""

    priority: str
    paused: bool = False
    paused_since: float = 0.0  # when it was last paused (the admission's clock)
    paused_s: float = 0.0  # paused time before that

    def paused_for(self, now: float) -> float:
        """Its time paused so far: what its hold of a running slot leaves out."""
        return self.paused_s + (now - self.paused_since if self.paused else 0.0)


@dataclass(eq=False)
class _Waiter:
    """A request waiting for a running slot: the future is set to its SlotHolder when a slot is
    handed to it, or to a QueueRefused when a request of a higher priority took its place."""

    priority: str
    enqueued: float
    raw_wait_s: float
    started: asyncio.Future[SlotHolder] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Admission:
    def __init__(
        self,
        max_running: int,
        max_queued: int,
        max_wait_s: float = MAX_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        critical_reserve: float = 0.0,
        pausable: int = 0,
    ) -> None:
        """`critical_reserve`: running slots beyond `max_running` only critical requests may
        take, as a share of `max_running` (rounded down). `pausable`: how many running batch
        requests critical ones may pause at once (0: none; an engine that can pause sets it, and
        holds that many more requests' state)."""
        self.max_running = max_running
        self.max_queued = max_queued
        self.max_wait_s = max_wait_s
        self.running = 0
        self.queued = 0
        self.reserve = int(max_running * critical_reserve)  # extra slots for critical requests
        self.pausable = pausable
        self.paused = 0  # holders paused for critical requests (not counted in `running`)
        self._holders: list[SlotHolder] = []  # running or paused, in start order
        self._running_critical = 0
        self.rejected = 0
        self.late_refusals = 0  # refused after waiting in the queue (the estimate was wrong)
        self.hold_s = FIRST_HOLD_S  # mean time a running slot is held, measured as they end
        self.handover_s: float | None = None  # mean time between hand-overs while requests wait
        self.wait_ratio = 1.0  # mean real wait over expected wait of the requests that queued
        self._measured = False
        self._clock = clock
        self._last_release = 0.0  # when a slot was last released
        self._waiting_since = 0.0  # when the queue last went from empty to waiting
        self._waiters: list[_Waiter] = []  # in arrival order

    @property
    def queued_batch(self) -> int:
        """How many of the waiting requests are batch: the others go before them."""
        return sum(1 for w in self._waiters if w.priority == BATCH)

    def _per_handover_s(self) -> float:
        """The time between slot hand-overs: measured, or until then the mean hold time over the
        running slots (slots that end independently free one every hold_s / max_running on
        average). A burst that outruns it is caught by the correction (the oldest waiter's
        ratio) and, at worst, by the late refusal."""
        if self.handover_s is not None:
            return self.handover_s
        return self.hold_s / self.max_running

    def _can_start(self, priority: str) -> bool:
        """Whether a slot is free for a request of `priority`: any of the max_running +
        reserve slots for a critical one, for the others only while they hold fewer than
        max_running."""
        if self.running >= self.max_running + self.reserve:
            return False
        others = self.running - self._running_critical
        return priority == CRITICAL or others < self.max_running

    def _start(self, priority: str) -> SlotHolder:
        self.running += 1
        self._running_critical += priority == CRITICAL
        holder = SlotHolder(priority)
        self._holders.append(holder)
        return holder

    def _to_pause(self, priority: str) -> SlotHolder | None:
        """The running holder a newcomer of `priority` would take the slot of (to_pause), if the
        engine can pause one more; else None."""
        if self.paused >= self.pausable:
            return None
        running = [h for h in self._holders if not h.paused]
        index = to_pause(priority, [h.priority for h in running])
        return None if index is None else running[index]

    def _may_pause(self, priority: str) -> bool:
        return self._to_pause(priority) is not None

    def _pause(self, holder: SlotHolder) -> None:
        holder.paused, holder.paused_since = True, self._clock()
        self.paused += 1
        self.running -= 1
        self._running_critical -= holder.priority == CRITICAL

    def _resume_one(self) -> bool:
        """Resumes the oldest paused holder into a freed slot if one may take it; whether it
        did."""
        for holder in self._holders:
            if holder.paused and self._can_start(holder.priority):
                holder.paused = False
                holder.paused_s += self._clock() - holder.paused_since
                self.paused -= 1
                self.running += 1
                self._running_critical += holder.priority == CRITICAL
                return True
        return False

    def _raw_wait_s(self, priority: str = INTERACTIVE) -> float:
        """The wait of a request of `priority` arriving now by the hand-over rate alone: 0 while
        a slot is free for it (or a request it may pause runs) and nobody it would start after
        waits, else one hand-over more than the waiting requests it would start after."""
        ahead = ahead_of(priority, [w.priority for w in self._waiters])
        if ahead == 0 and (self._can_start(priority) or self._may_pause(priority)):
            return 0.0
        return (ahead + 1) * self._per_handover_s()

    def correction(self) -> float:
        """Real over expected wait: the running average of the requests that got their slot, or
        the oldest waiting request's so far when that is larger."""
        for waiter in self._waiters[:1]:  # the oldest
            if waiter.raw_wait_s > 0:
                return max(self.wait_ratio, (self._clock() - waiter.enqueued) / waiter.raw_wait_s)
        return self.wait_ratio

    def expected_wait_s(self, priority: str = INTERACTIVE) -> float:
        """How long a request of `priority` arriving now is expected to wait for a running slot,
        corrected by how the expectation has compared with the waits seen."""
        return self._raw_wait_s(priority) * self.correction()

    def _refuse(
        self, why: str, deadline_bound: bool = False, priority: str = INTERACTIVE
    ) -> QueueRefused:
        """`deadline_bound`: only the request's own deadline refused it (no capacity verdict)."""
        self.rejected += 1
        wait = max(self.expected_wait_s(priority), self._per_handover_s())
        return QueueRefused(
            f"tier at capacity: {why} ({self.running} running, {self.queued} queued, limits "
            f"{self.max_running} and {self.max_queued}; expected wait {wait:.2f} s)",
            retry_after_s=wait,
            reason=WAIT_PAST_DEADLINE if deadline_bound else AT_CAPACITY,
        )

    @asynccontextmanager
    async def slot(
        self, deadline_s: float | None = None, priority: str = INTERACTIVE
    ) -> AsyncIterator[SlotHolder]:
        """Holds one running slot for the body (yields its SlotHolder); waits in the bounded
        queue if none is free and it may pause nobody.
        `deadline_s`: the seconds the request has left, None = no deadline; `priority`:
        "critical", "interactive" or "batch". Raises QueueRefused without waiting when the queue
        is full of requests of its priority or higher, or the expected wait passes
        min(deadline_s, max_wait_s); once queued, raises it past LATE_FACTOR times that, or
        DEADLINE_SHARE of the deadline, or when a request of a higher priority takes its place.
        """
        budget = self.max_wait_s if deadline_s is None else min(deadline_s, self.max_wait_s)
        waiting = [w.priority for w in self._waiters]
        if not may_queue(priority, waiting):  # batch, with people waiting: it would be passed over
            people = len(waiting) - self.queued_batch
            raise self._refuse(f"{people} requests of a higher priority wait", priority=priority)
        full = not (self._can_start(priority) or self._may_pause(priority))
        if self.queued >= self.max_queued and full:
            index = to_displace(priority, waiting)
            if index is None:
                raise self._refuse("queue full", priority=priority)
            self._displace(self._waiters[index], priority)
        raw = self._raw_wait_s(priority)
        # with a slot free nothing waits: a deadline already spent is the deadline's to end
        # (DEADLINE_EXCEEDED at the caller), not a refusal for capacity the tier has
        expected = raw * self.correction()
        if raw > 0 and expected > budget:
            bound = expected <= self.max_wait_s  # a caller with a longer deadline would queue
            raise self._refuse(f"it could not start within {budget:.2f} s", bound, priority)
        if raw == 0:
            if not self._can_start(priority) and (paused := self._to_pause(priority)):
                self._pause(paused)  # _raw_wait_s found no free slot but one it may pause
            holder = self._start(priority)
        else:
            holder = await self._wait(priority, raw, budget, deadline_s)
        started = self._clock()
        try:
            yield holder
        finally:
            ended = self._clock()
            held = ended - started - holder.paused_for(ended)  # a paused request held no slot
            self._release(holder)
            self._note_hold(held)

    async def _wait(
        self, priority: str, raw: float, budget: float, deadline_s: float | None
    ) -> SlotHolder:
        """Queues until a slot is handed over (self.running already counts it then)."""
        limit = budget * LATE_FACTOR
        if deadline_s is not None:
            limit = min(limit, deadline_s * DEADLINE_SHARE)
        waiter = _Waiter(priority, self._clock(), raw)
        if not self._waiters:
            self._waiting_since = waiter.enqueued
        self._waiters.append(waiter)
        self.queued += 1
        try:
            async with asyncio.timeout(limit):
                holder = await waiter.started
        except TimeoutError:
            if not self._leave(waiter):  # handed a slot as the time ran out: pass it on
                self._release(waiter.started.result())
            self.late_refusals += 1
            bound = limit < self.max_wait_s * LATE_FACTOR  # a caller without it would wait on
            raise self._refuse(f"no running slot within {limit:.2f} s", bound, priority) from None
        except BaseException:  # cancelled, or displaced (QueueRefused)
            if not self._leave(waiter):  # a slot was handed over as it left: pass it on
                self._release(waiter.started.result())
            raise
        self._note_wait(self._clock() - waiter.enqueued, raw)
        return holder

    def _leave(self, waiter: _Waiter) -> bool:
        """Takes a waiter that stops waiting out of the queue; False when a slot had already
        been handed to it (it holds that slot now)."""
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self.queued -= 1
        started = waiter.started
        return not (started.done() and not started.cancelled() and started.exception() is None)

    def _displace(self, waiter: _Waiter, by: str) -> None:
        """Refuses a waiting request whose place a request of priority `by` takes."""
        self._waiters.remove(waiter)
        self.queued -= 1
        waiter.started.set_exception(
            self._refuse(f"its place in a full queue went to a {by} request", priority=by)
        )

    def _release(self, holder: SlotHolder) -> None:
        """A holder ends. A paused one frees only its place, and a pause (a critical request
        waiting for one starts). A running one's slot resumes a paused holder first unless a
        critical request waits (resumes_first), else it is handed to the next waiting request if
        that may take it (a reserved slot waits for a critical one), else freed."""
        self._holders.remove(holder)
        if holder.paused:
            self.paused -= 1
            self._start_by_pausing()
            return
        ended = self._clock()
        self.running -= 1
        self._running_critical -= holder.priority == CRITICAL
        if (
            self.paused
            and resumes_first([w.priority for w in self._waiters])
            and self._resume_one()
        ):
            self._last_release = ended
            return
        if self._waiters:
            waiter = self._next_waiter()
            if self._can_start(waiter.priority):  # one hand-over, timed
                self._note_handover(ended - max(self._last_release, self._waiting_since))
                self._hand_over(waiter)
        self._last_release = ended

    def _start_by_pausing(self) -> None:
        """A paused holder left, so the engine may pause one more: the next waiting request
        starts now if it may pause a running one (a critical request that found every slot
        taken and every pause in use)."""
        if not self._waiters:
            return
        waiter = self._next_waiter()
        if (running := self._to_pause(waiter.priority)) is not None:
            self._pause(running)
            self._hand_over(waiter)

    def _next_waiter(self) -> _Waiter:
        """The waiting request a slot goes to next (next_to_start); some must wait."""
        return self._waiters[next_to_start([w.priority for w in self._waiters])]

    def _hand_over(self, waiter: _Waiter) -> None:
        """Takes `waiter` out of the queue and starts it in a slot it may take."""
        self._waiters.remove(waiter)
        self.queued -= 1
        waiter.started.set_result(self._start(waiter.priority))

    def _note_hold(self, seconds: float) -> None:
        if not self._measured:
            self.hold_s, self._measured = seconds, True
        else:
            self.hold_s += HOLD_WEIGHT * (seconds - self.hold_s)

    def _note_handover(self, seconds: float) -> None:
        if self.handover_s is None:
            self.handover_s = seconds
        else:
            self.handover_s += HANDOVER_WEIGHT * (seconds - self.handover_s)

    def _note_wait(self, waited_s: float, expected_s: float) -> None:
        """A queued request got its slot after `waited_s`; `expected_s` was its raw estimate."""
        low, high = RATIO_BOUNDS
        ratio = min(high, max(low, waited_s / expected_s))
        self.wait_ratio += RATIO_WEIGHT * (ratio - self.wait_ratio)
