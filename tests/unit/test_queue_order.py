"""A tier's wait queue by priority: who starts next, who a newcomer waits behind, whose place it
takes at a full queue (services/tier/queue_order.py), as a table of scenarios."""

from __future__ import annotations

import pytest

from services.tier.queue_order import (
    ahead_of,
    may_queue,
    next_to_start,
    resumes_first,
    to_displace,
    to_pause,
)

C, N, B = "critical", "interactive", "batch"  # N: normal

# waiting (arrival order) -> index of the request a freed slot goes to
NEXT = [
    ([N], 0),
    ([B, N], 1),  # interactive before an older batch request
    ([B, N, C, N], 2),  # critical first, whenever it came
    ([N, N, B], 0),  # arrival order within a priority
    ([B, B], 0),
    ([B, C, C], 1),  # the older of two critical
]

# (newcomer, waiting) -> how many it would start after
AHEAD = [
    (N, [], 0),
    (C, [N, B, N], 0),  # critical waits behind no one of lower priority
    (C, [C, N], 1),
    (N, [B, N, C], 2),  # interactive passes batch
    (B, [B, N, C], 3),  # batch waits behind everyone
]

# (newcomer, waiting) -> index whose place it takes at a full queue, None: refused
DISPLACE = [
    (C, [N, B, N, B], 3),  # the newest batch
    (N, [B, N, B, N], 2),
    (C, [N, N], 1),  # no batch waiting: the newest interactive
    (N, [N, C, N], None),  # nobody of lower priority: the newcomer is refused
    (B, [B, B], None),
    (C, [C, C], None),
    (B, [], None),
]


# (newcomer, waiting) -> whether it may wait in the queue (no free slot for it)
MAY_QUEUE = [
    (B, [], True),
    (B, [B, B], True),  # behind batch only: it will start in its turn
    (B, [B, N], False),  # a person waits: batch would be passed over, refused at once
    (B, [C], False),
    (N, [B, N, C], True),  # interactive and critical always queue (within their budget)
    (C, [C, C], True),
]


@pytest.mark.parametrize(("priority", "waiting", "expected"), MAY_QUEUE)
def test_batch_queues_only_behind_batch(priority: str, waiting: list[str], expected: bool) -> None:
    assert may_queue(priority, waiting) is expected


@pytest.mark.parametrize(("waiting", "expected"), NEXT)
def test_a_freed_slot_goes_to_the_oldest_of_the_highest_priority(
    waiting: list[str], expected: int
) -> None:
    assert next_to_start(waiting) == expected


@pytest.mark.parametrize(("priority", "waiting", "expected"), AHEAD)
def test_a_newcomer_waits_behind_its_priority_and_higher(
    priority: str, waiting: list[str], expected: int
) -> None:
    assert ahead_of(priority, waiting) == expected


@pytest.mark.parametrize(("priority", "waiting", "expected"), DISPLACE)
def test_at_a_full_queue_the_newest_of_the_lowest_priority_gives_way(
    priority: str, waiting: list[str], expected: int | None
) -> None:
    assert to_displace(priority, waiting) == expected


def test_unknown_priorities_and_an_empty_queue_are_errors() -> None:
    with pytest.raises(ValueError, match="priority: one of critical, interactive, batch"):
        ahead_of("urgent", [])
    with pytest.raises(ValueError, match="nobody is waiting"):
        next_to_start([])


PAUSE = [
    # (newcomer, running in start order, the one it pauses)
    ("critical", ["batch", "interactive", "batch", "interactive"], 2),  # the newest batch
    ("critical", ["batch"], 0),
    ("critical", ["interactive", "critical"], None),  # people's requests are never paused
    ("critical", [], None),
    ("interactive", ["batch", "batch"], None),  # only a critical request pauses anyone
    ("batch", ["batch"], None),
]
RESUME = [
    # (waiting, whether a freed slot resumes a paused request first)
    ([], True),
    (["interactive", "batch"], True),  # it was started before them, and holds its KV cache
    (["batch", "critical"], False),  # a waiting critical request goes first
]


@pytest.mark.parametrize(("priority", "running", "expected"), PAUSE)
def test_a_critical_newcomer_pauses_the_newest_batch_request(
    priority: str, running: list[str], expected: int | None
) -> None:
    assert to_pause(priority, running) == expected


@pytest.mark.parametrize(("waiting", "expected"), RESUME)
def test_a_freed_slot_resumes_a_paused_request_unless_a_critical_one_waits(
    waiting: list[str], expected: bool
) -> None:
    assert resumes_first(waiting) is expected
