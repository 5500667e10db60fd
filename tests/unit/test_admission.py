"""Bounded admission: running slots, a bounded queue, immediate refusal past both."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.common.errors import Overloaded
from services.tier.admission import HOLD_WEIGHT, Admission, SlotHolder


class SlotRuns:
    """Named requests that each hold a slot of `admission` (queueing for it if they must) until
    their event in `done` is set; `holders` has each one's SlotHolder once it holds a slot."""

    def __init__(self, admission: Admission, names: tuple[str, ...]) -> None:
        self.done = {name: asyncio.Event() for name in names}
        self.holders: dict[str, SlotHolder] = {}
        self._admission = admission

    async def run(self, name: str, priority: str) -> None:
        async with self._admission.slot(priority=priority) as holder:
            self.holders[name] = holder
            await self.done[name].wait()


def holding(admission: Admission, release: asyncio.Event) -> asyncio.Task[None]:
    """A task that takes a running slot of `admission` (queueing for it if it must) and keeps
    it until `release` is set."""

    async def hold() -> None:
        async with admission.slot():
            await release.wait()

    return asyncio.create_task(hold())


async def test_admission_queues_then_refuses() -> None:
    admission = Admission(max_running=1, max_queued=1)
    release = asyncio.Event()
    entered: list[str] = []

    async def hold(name: str) -> None:
        async with admission.slot():
            entered.append(name)
            await release.wait()

    first = asyncio.create_task(hold("first"))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold("second"))
    await asyncio.sleep(0)
    assert (admission.running, admission.queued) == (1, 1)
    with pytest.raises(Overloaded, match="1 running, 1 queued"):
        async with admission.slot():
            pass
    assert admission.rejected == 1
    release.set()
    await asyncio.gather(first, second)
    assert entered == ["first", "second"]
    assert (admission.running, admission.queued) == (0, 0)


async def test_cancelled_waiter_leaves_the_queue() -> None:
    admission = Admission(max_running=1, max_queued=1)
    release = asyncio.Event()

    holder = holding(admission, release)
    await asyncio.sleep(0)
    waiter = holding(admission, release)
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.queued == 0
    release.set()
    await holder
    assert admission.running == 0


async def test_a_free_slot_is_taken_even_by_a_request_whose_deadline_is_spent() -> None:
    admission = Admission(max_running=1, max_queued=1)
    async with admission.slot(deadline_s=-0.001):  # nothing to wait for: no capacity refusal
        assert admission.running == 1
    assert (admission.running, admission.rejected) == (0, 0)


async def test_a_freed_slot_goes_to_critical_then_interactive_then_batch() -> None:
    admission = Admission(max_running=1, max_queued=3)
    release = asyncio.Event()
    started: list[str] = []

    async def run(priority: str) -> None:
        async with admission.slot(priority=priority):
            started.append(priority)
            await release.wait()

    holder = holding(admission, release)
    await asyncio.sleep(0)
    waiters = []
    for priority in ("batch", "interactive", "critical"):  # arriving lowest first
        waiters.append(asyncio.create_task(run(priority)))
        await asyncio.sleep(0)
    assert (admission.running, admission.queued, admission.queued_batch) == (1, 3, 1)
    # a newcomer is expected to wait behind its own priority and higher only
    assert admission.expected_wait_s("critical") < admission.expected_wait_s("batch")
    release.set()
    await asyncio.gather(holder, *waiters)
    assert started == ["critical", "interactive", "batch"]
    assert (admission.running, admission.queued) == (0, 0)


async def test_at_a_full_queue_a_critical_request_takes_the_newest_batch_place() -> None:
    admission = Admission(max_running=1, max_queued=2)
    release = asyncio.Event()
    started: list[str] = []

    async def run(name: str, priority: str) -> None:
        async with admission.slot(priority=priority):
            started.append(name)
            await release.wait()

    holder = holding(admission, release)
    await asyncio.sleep(0)
    older = asyncio.create_task(run("older batch", "batch"))
    await asyncio.sleep(0)
    newer = asyncio.create_task(run("newer batch", "batch"))
    await asyncio.sleep(0)
    assert (admission.queued, admission.queued_batch) == (2, 2)
    critical = asyncio.create_task(run("critical", "critical"))
    with pytest.raises(Overloaded, match="its place in a full queue went to a critical request"):
        await newer
    assert (admission.queued, admission.queued_batch, admission.rejected) == (2, 1, 1)
    # a critical request waits: another batch request is refused at once, not queued behind it
    with pytest.raises(Overloaded, match="1 requests of a higher priority wait"):
        async with admission.slot(priority="batch"):
            pass
    release.set()
    await asyncio.gather(holder, older, critical)
    assert started == ["critical", "older batch"]
    assert (admission.running, admission.queued) == (0, 0)


async def test_a_waiter_cancelled_as_its_slot_is_handed_over_passes_the_slot_on() -> None:
    admission = Admission(max_running=1, max_queued=2)
    release = asyncio.Event()
    holder_done = asyncio.Event()
    started: list[str] = []

    async def first() -> None:
        async with admission.slot():
            await holder_done.wait()

    async def run(name: str) -> None:
        async with admission.slot():
            started.append(name)
            await release.wait()

    holder = asyncio.create_task(first())
    await asyncio.sleep(0)
    unlucky = asyncio.create_task(run("unlucky"))
    await asyncio.sleep(0)
    next_one = asyncio.create_task(run("next"))
    await asyncio.sleep(0)
    holder_done.set()
    await asyncio.sleep(0)  # the holder leaves and hands its slot to `unlucky` ...
    assert (admission.running, admission.queued) == (1, 1)  # handed over, not yet resumed
    unlucky.cancel()  # ... which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    release.set()
    await asyncio.gather(holder, next_one)
    assert started == ["next"]
    assert (admission.running, admission.queued) == (0, 0)


async def test_a_tenth_more_slots_are_kept_for_critical_requests() -> None:
    admission = Admission(max_running=10, max_queued=4, critical_reserve=0.1)
    assert admission.reserve == 1
    release = asyncio.Event()
    started: list[str] = []

    async def run(name: str, priority: str) -> None:
        async with admission.slot(priority=priority):
            started.append(name)
            await release.wait()

    tasks = [asyncio.create_task(run(f"i{n}", "interactive")) for n in range(11)]
    await asyncio.sleep(0)
    assert (admission.running, admission.queued) == (10, 1)  # all of max_running; the 11th waits
    critical = asyncio.create_task(run("c", "critical"))
    await asyncio.sleep(0)
    assert started[-1] == "c" and (admission.running, admission.queued) == (11, 1)
    another = asyncio.create_task(run("c2", "critical"))  # the critical slot is taken: it waits
    await asyncio.sleep(0)
    assert (admission.running, admission.queued) == (11, 2) and "c2" not in started
    release.set()
    await asyncio.gather(*tasks, critical, another)
    assert started.index("c2") < started.index("i10")  # the first slot freed went to it
    assert (admission.running, admission.queued) == (0, 0)
    assert Admission(max_running=9, max_queued=0, critical_reserve=0.1).reserve == 0  # rounded down
    assert Admission(max_running=64, max_queued=0).reserve == 0  # none unless configured


async def test_a_slot_a_critical_request_leaves_is_kept_for_the_next_one() -> None:
    admission = Admission(max_running=10, max_queued=4, critical_reserve=0.1)
    hold, critical_done = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    async def run(name: str, priority: str, until: asyncio.Event) -> None:
        async with admission.slot(priority=priority):
            started.append(name)
            await until.wait()

    others = [asyncio.create_task(run(f"i{n}", "interactive", hold)) for n in range(10)]
    first = asyncio.create_task(run("c1", "critical", critical_done))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(run("i10", "interactive", hold))
    await asyncio.sleep(0)
    assert (admission.running, admission.queued) == (11, 1)
    critical_done.set()
    await first
    # the waiting interactive request may not take the reserved slot the critical one left
    assert (admission.running, admission.queued) == (10, 1) and "i10" not in started
    second = asyncio.create_task(run("c2", "critical", critical_done))
    await asyncio.sleep(0)
    assert started[-1] == "c2"
    hold.set()
    await asyncio.gather(*others, waiting, second)
    assert (admission.running, admission.queued) == (0, 0)


async def _settle() -> None:
    """Lets every task that can run do so: a release hands a slot over, its taker resumes."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_critical_request_pauses_the_newest_batch_one_and_resumes_it_after() -> None:
    admission = Admission(max_running=2, max_queued=4, critical_reserve=0.5, pausable=1)
    runs = SlotRuns(admission, ("b1", "b2", "c1", "c2", "c3"))
    done, holders, run = runs.done, runs.holders, runs.run

    tasks = [asyncio.create_task(run("b1", "batch")), asyncio.create_task(run("b2", "batch"))]
    tasks.append(asyncio.create_task(run("c1", "critical")))  # the reserved slot
    await _settle()
    assert (admission.running, admission.paused, admission.queued) == (3, 0, 0)
    tasks.append(asyncio.create_task(run("c2", "critical")))  # every slot taken: pauses b2
    await _settle()
    assert "c2" in holders and holders["b2"].paused and not holders["b1"].paused
    assert (admission.running, admission.paused, admission.queued) == (3, 1, 0)
    tasks.append(asyncio.create_task(run("c3", "critical")))  # one pause at once: it waits
    await _settle()
    assert "c3" not in holders and (admission.running, admission.paused, admission.queued) == (
        3,
        1,
        1,
    )
    done["c2"].set()  # a waiting critical request goes before the paused one
    await _settle()
    assert "c3" in holders and holders["b2"].paused
    done["c3"].set()  # now the paused one resumes
    await _settle()
    assert not holders["b2"].paused and (admission.running, admission.paused) == (3, 0)
    for event in done.values():
        event.set()
    await asyncio.gather(*tasks)
    assert (admission.running, admission.paused, admission.queued) == (0, 0, 0)


async def test_a_paused_request_that_leaves_frees_its_place_and_people_are_never_paused() -> None:
    admission = Admission(max_running=1, max_queued=2, pausable=1)
    runs = SlotRuns(admission, ("b", "c", "i", "c2"))
    done, holders, run = runs.done, runs.holders, runs.run

    batch = asyncio.create_task(run("b", "batch"))
    await _settle()
    critical = asyncio.create_task(run("c", "critical"))
    await _settle()
    assert holders["b"].paused and (admission.running, admission.paused) == (1, 1)
    batch.cancel()  # its caller left while paused: its place is free, no slot changes hands
    with contextlib.suppress(asyncio.CancelledError):
        await batch
    assert (admission.running, admission.paused) == (1, 0)
    done["c"].set()
    await critical
    people = asyncio.create_task(run("i", "interactive"))
    await _settle()
    other = asyncio.create_task(run("c2", "critical"))  # an interactive request is not paused
    await _settle()
    assert not holders["i"].paused and "c2" not in holders and admission.queued == 1
    done["i"].set()
    done["c2"].set()
    await asyncio.gather(people, other)
    assert (admission.running, admission.paused, admission.queued) == (0, 0, 0)


async def test_a_critical_request_waiting_for_a_pause_starts_when_a_paused_one_leaves() -> None:
    admission = Admission(max_running=2, max_queued=2, pausable=1)
    runs = SlotRuns(admission, ("b1", "b2", "c1", "c2"))
    done, holders, run = runs.done, runs.holders, runs.run

    tasks = {name: asyncio.create_task(run(name, "batch")) for name in ("b1", "b2")}
    await _settle()
    tasks["c1"] = asyncio.create_task(run("c1", "critical"))  # pauses b2
    await _settle()
    tasks["c2"] = asyncio.create_task(run("c2", "critical"))  # the one pause in use: it waits
    await _settle()
    assert holders["b2"].paused and "c2" not in holders and admission.queued == 1
    tasks["b2"].cancel()  # the paused request's caller leaves: its pause is free again
    with contextlib.suppress(asyncio.CancelledError):
        await tasks["b2"]
    await _settle()
    assert "c2" in holders and holders["b1"].paused  # started at once, pausing b1
    assert (admission.running, admission.paused, admission.queued) == (2, 1, 0)
    for event in done.values():
        event.set()
    await asyncio.gather(*(t for name, t in tasks.items() if name != "b2"))
    assert (admission.running, admission.paused, admission.queued) == (0, 0, 0)


async def test_time_paused_is_not_counted_as_holding_a_slot() -> None:
    now = [0.0]
    admission = Admission(max_running=1, max_queued=1, pausable=1, clock=lambda: now[0])
    runs = SlotRuns(admission, ("b", "c"))
    done, run = runs.done, runs.run

    batch = asyncio.create_task(run("b", "batch"))
    await _settle()
    now[0] = 1.0
    critical = asyncio.create_task(run("c", "critical"))  # pauses the batch request for 10 s
    await _settle()
    now[0] = 11.0
    done["c"].set()
    await critical
    assert admission.hold_s == pytest.approx(10.0)  # the critical request's hold, the first
    now[0] = 13.0
    done["b"].set()
    await batch  # held 13 s, 10 of them paused: 3 s
    assert admission.hold_s == pytest.approx(10.0 + HOLD_WEIGHT * (3.0 - 10.0))
