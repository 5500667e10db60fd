"""Fast refusals with a retry delay from the queue: the tier's admission (expected wait against
the deadline and the longest wait), the KV pool's slot reservation, and the router's refusal
when every candidate tier reports a full queue. No servers."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest
import torch

from services.common.config import RouterConfig
from services.common.errors import AT_CAPACITY, WAIT_PAST_DEADLINE
from services.router.fallback import TiersFull, choose_with_fallback
from services.router.policy import TierLoad
from services.tier.admission import Admission, QueueRefused
from services.tier.kv_pool import KvCachePool, PoolFull
from tests.unit.test_admission import holding


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _hold_once(admission: Admission, clock: Clock, seconds: float) -> None:
    async with admission.slot():
        clock.now += seconds


async def test_a_request_that_cannot_start_in_its_deadline_is_refused_at_once() -> None:
    clock = Clock()
    admission = Admission(max_running=2, max_queued=8, max_wait_s=5.0, clock=clock)
    await _hold_once(admission, clock, 6.0)  # one measured hold: 6 s
    assert admission.hold_s == pytest.approx(6.0)
    release = asyncio.Event()

    holders = [holding(admission, release) for _ in range(2)]
    await asyncio.sleep(0)
    # no hand-over measured yet: the hold time over the two slots per hand-over
    assert admission.expected_wait_s() == pytest.approx(3.0)
    with pytest.raises(QueueRefused, match=r"could not start within 1\.00 s") as refused:
        async with admission.slot(deadline_s=1.0):
            pass
    assert refused.value.retry_after_s == pytest.approx(3.0)
    # only its own deadline refused it: a request without one would queue
    assert refused.value.reason == WAIT_PAST_DEADLINE
    assert admission.queued == 0 and admission.rejected == 1
    waiter = holding(admission, release)  # 3 s expected, within 5 s: it queues
    await asyncio.sleep(0)
    assert admission.queued == 1
    assert admission.expected_wait_s() == pytest.approx(6.0)  # now second in line
    with pytest.raises(QueueRefused, match=r"could not start within 5\.00 s") as refused:
        async with admission.slot():  # 6 s is past the longest wait: at capacity for anyone
            pass
    assert refused.value.reason == AT_CAPACITY
    release.set()
    await asyncio.gather(*holders, waiter)


async def test_a_queued_request_is_refused_when_its_wait_runs_out() -> None:
    admission = Admission(max_running=1, max_queued=4, max_wait_s=0.05)
    admission.hold_s = 0.01  # so the estimate lets it queue
    release = asyncio.Event()

    holder = holding(admission, release)
    await asyncio.sleep(0)
    with pytest.raises(QueueRefused, match=r"no running slot within 0\.10 s") as refused:
        async with admission.slot():  # the estimate was wrong: refused late, at 2x its wait
            pass
    assert refused.value.retry_after_s > 0 and refused.value.reason == AT_CAPACITY
    assert admission.late_refusals == 1
    assert (admission.running, admission.queued) == (1, 0)
    release.set()
    await holder
    assert admission.running == 0


async def test_a_wait_longer_than_expected_corrects_the_estimate_at_once_and_after() -> None:
    clock = Clock()
    admission = Admission(max_running=1, max_queued=8, max_wait_s=5.0, clock=clock)
    await _hold_once(admission, clock, 1.0)  # held 1 s: one hand-over a second expected
    release = asyncio.Event()

    holder = holding(admission, release)
    await asyncio.sleep(0)
    waiter = holding(admission, release)  # expected to wait 1 s
    await asyncio.sleep(0)
    assert admission.expected_wait_s() == pytest.approx(2.0)  # second in line, as expected
    clock.now += 3.0  # the first in line has waited 3 s of its expected 1 s: x3 from now on
    assert admission.expected_wait_s() == pytest.approx(6.0)
    with pytest.raises(QueueRefused, match=r"could not start within 5\.00 s") as refused:
        async with admission.slot():
            pass
    assert refused.value.retry_after_s == pytest.approx(6.0)
    assert admission.late_refusals == 0
    release.set()  # the waiter starts after 3 s: that wait and that hand-over are measured
    await asyncio.gather(holder, waiter)
    assert admission.handover_s == pytest.approx(3.0)
    assert admission.wait_ratio == pytest.approx(1.4)  # 1 + 0.2 x (3 - 1)
    holder = holding(admission, release)
    release.clear()
    await asyncio.sleep(0)
    assert admission.expected_wait_s() == pytest.approx(3.0 * 1.4)
    release.set()
    await holder


async def test_waits_shorter_than_expected_never_lower_the_estimate() -> None:
    """A queued request that starts sooner than expected (those ahead left, say) does not
    make the next estimate shorter than the hand-over rate alone: trusting such waits queued
    requests that then waited past twice their budget."""
    clock = Clock()
    admission = Admission(max_running=1, max_queued=8, max_wait_s=5.0, clock=clock)
    await _hold_once(admission, clock, 2.0)  # 2 s a hand-over expected
    release = asyncio.Event()
    holder = holding(admission, release)
    await asyncio.sleep(0)
    waiter = holding(admission, release)  # expected to wait 2 s
    await asyncio.sleep(0)
    clock.now += 0.2  # it starts after 0.2 s: a tenth of what was expected
    release.set()
    await asyncio.gather(holder, waiter)
    assert admission.wait_ratio == pytest.approx(1.0)
    release.clear()
    holder = holding(admission, release)
    await asyncio.sleep(0)
    assert admission.expected_wait_s() == pytest.approx(admission.handover_s or 0.0)
    assert admission.expected_wait_s() > 0
    release.set()
    await holder


async def test_the_retry_delay_of_a_full_queue_comes_from_the_measured_hold() -> None:
    clock = Clock()
    admission = Admission(max_running=1, max_queued=1, clock=clock)
    await _hold_once(admission, clock, 0.4)
    release = asyncio.Event()

    tasks = [holding(admission, release) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueRefused, match="queue full") as refused:
        async with admission.slot():
            pass
    assert refused.value.retry_after_s == pytest.approx(0.8)  # 2 ahead, 1 slot, 0.4 s each
    release.set()
    await asyncio.gather(*tasks)


def test_pool_slots_are_reserved_once_across_threads() -> None:
    pool = KvCachePool(
        layers=1,
        slots=8,
        heads=1,
        max_len=4,
        head_dim=2,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    taken: list[int] = []
    refused: list[int] = []
    lock = threading.Lock()

    def reserve() -> None:
        for _ in range(4):
            try:
                slot = pool.acquire()
            except PoolFull:
                with lock:
                    refused.append(1)
                continue
            with lock:
                taken.append(slot)

    threads = [threading.Thread(target=reserve) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(8)) and len(refused) == 8  # each slot once, then refused
    pool.release(taken[0])
    with pytest.raises(ValueError, match="released twice"):
        pool.release(taken[0])
    assert pool.free_slots == 1


FULL = TierLoad(True, 4, 16, 4, 16, 800.0, 2000.0)
IDLE = TierLoad(True, 0, 0, 4, 16, 10.0, 20.0)


def test_the_router_refuses_at_once_when_every_candidate_tier_is_full() -> None:
    config = RouterConfig()
    loads = {"small": FULL, "medium": FULL, "large": TierLoad(True, 4, 16, 4, 16, 300.0, 900.0)}
    with pytest.raises(TiersFull, match="every tier full") as refused:
        choose_with_fallback("small", loads, config)
    assert refused.value.status == "RESOURCE_EXHAUSTED"
    assert refused.value.retry_after_s == pytest.approx(0.3)  # the soonest tier's TTFT p50
    # one tier with room: no refusal, it falls back
    assert choose_with_fallback("small", {**loads, "large": IDLE}, config)[0] == "large"
    # a tier whose load is unknown is not known to be full: tried, not refused
    assert choose_with_fallback("small", {**loads, "large": None}, config)[0] == "small"


def test_tiers_that_refused_at_their_last_reported_load_are_full_to_the_router() -> None:
    config = RouterConfig()
    refusing = replace(IDLE, running=4, refusing=True)
    loads = {"small": refusing, "medium": FULL, "large": refusing}
    with pytest.raises(TiersFull, match="small refused a call at 4 running, 0 queued"):
        choose_with_fallback("small", loads, config)
    tier, note, _ = choose_with_fallback("small", {**loads, "medium": IDLE}, config)
    assert tier == "medium" and "small refused a call" in note


def test_tiers_whose_reported_wait_is_past_their_limit_are_full_to_the_router() -> None:
    config = RouterConfig()
    # slots all taken and a short queue, but each new request would wait past the tier's 5 s
    slow = replace(IDLE, running=4, queued=3, expected_wait_ms=6000.0, max_wait_ms=5000.0)
    within = replace(slow, expected_wait_ms=4000.0)
    loads = {"small": slow, "medium": slow, "large": slow}
    with pytest.raises(TiersFull, match=r"small full \(expected wait 6\.00 s over its 5\.00 s"):
        choose_with_fallback("small", loads, config)
    tier, note, _ = choose_with_fallback("small", {**loads, "large": within}, config)
    assert tier == "large" and "expected wait 6.00 s" in note
    # a tier that does not report its limit (0) is judged by its queue alone
    unknown = replace(slow, max_wait_ms=0.0)
    assert choose_with_fallback("small", {**loads, "small": unknown}, config)[0] == "small"


def test_a_load_moved_on_by_calls_since_its_report() -> None:
    # 3 of 4 slots running at the report: two more calls take the last slot, then queue one
    moved = replace(IDLE, running=3).after_calls(2)
    assert (moved.running, moved.queued, moved.expected_wait_ms) == (4, 1, 0.0)  # wait unknown
    # slots full and 2 queued at the report, 3 s expected (1 s a hand-over): 3 more calls
    busy = replace(FULL, queued=2, expected_wait_ms=3000.0, max_wait_ms=5000.0)
    moved = busy.after_calls(3)
    assert (moved.running, moved.queued) == (4, 5)
    assert moved.expected_wait_ms == pytest.approx(6000.0) and moved.wait_too_long
    # calls that ended since: the queue drains first, then the slots free
    drained = busy.after_calls(-4)
    assert (drained.running, drained.queued, drained.expected_wait_ms) == (2, 0, 0.0)
    assert busy.after_calls(-100).running == 0
    # a queue past its limit reads as full
    assert replace(IDLE, running=4, queued=15).after_calls(1).queue_full
