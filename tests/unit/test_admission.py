"""Bounded admission: running slots, a bounded queue, immediate refusal past both."""

from __future__ import annotations

import asyncio

import pytest

from services.common.errors import Overloaded
from services.tier.admission import Admission


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
