"""The order of a tier's wait queue by priority: who starts next, how many a newcomer waits
behind, and whose place a newcomer takes at a full queue. Pure functions over the waiting
requests' priorities in arrival order; admission.py does the waiting.

Critical starts before interactive, interactive before batch; within a priority, arrival order.
A batch request does not join a queue where a request of a higher priority already waits: it
would be passed over for as long as they keep coming, and then refused late (or its place taken);
refused at once it can retry when the people have been served. Where the engine can pause a
running request (it keeps its KV cache and goes on where it was), a critical request that finds
no free slot pauses the newest batch request running instead of waiting; a freed slot resumes a
paused request before it starts a waiting one, unless a critical request waits.
"""

from __future__ import annotations

from collections.abc import Sequence

CRITICAL = "critical"
INTERACTIVE = "interactive"
BATCH = "batch"
RANK = {CRITICAL: 0, INTERACTIVE: 1, BATCH: 2}  # lower starts first


def rank_of(priority: str) -> int:
    """A request's rank (lower starts first), an unknown priority's as interactive: how the
    engines order the requests they hold (the batch planner's prefills, vLLM's scheduler)."""
    return RANK.get(priority, RANK[INTERACTIVE])


def _rank(priority: str) -> int:
    try:
        return RANK[priority]
    except KeyError:
        raise ValueError(f"priority: one of {', '.join(RANK)}, got {priority!r}") from None


def ahead_of(priority: str, waiting: Sequence[str]) -> int:
    """How many of the waiting requests a newcomer of `priority` would start after: those of
    its priority or a higher one."""
    rank = _rank(priority)
    return sum(1 for p in waiting if _rank(p) <= rank)


def next_to_start(waiting: Sequence[str]) -> int:
    """The index of the waiting request a freed slot goes to: the oldest of the highest
    priority waiting. `waiting` must not be empty."""
    if not waiting:
        raise ValueError("next_to_start: nobody is waiting")
    ranks = [_rank(p) for p in waiting]
    return ranks.index(min(ranks))


def may_queue(priority: str, waiting: Sequence[str]) -> bool:
    """Whether a newcomer of `priority` that finds no free slot may wait in the queue: always,
    except a batch request while a critical or interactive request waits."""
    return _rank(priority) < RANK[BATCH] or all(_rank(p) == RANK[BATCH] for p in waiting)


def to_displace(priority: str, waiting: Sequence[str]) -> int | None:
    """At a full queue, the index of the waiting request a newcomer of `priority` takes the
    place of: the newest of the lowest priority waiting, if that is lower than the newcomer's;
    None when every waiting request is of its priority or higher (the newcomer is refused)."""
    rank = _rank(priority)
    ranks = [_rank(p) for p in waiting]
    if not ranks or max(ranks) <= rank:
        return None
    lowest = max(ranks)
    return len(ranks) - 1 - ranks[::-1].index(lowest)


def to_pause(priority: str, running: Sequence[str]) -> int | None:
    """The index of the running request (in start order, the paused ones left out) a newcomer of
    `priority` that finds no free slot pauses: for a critical one the newest batch request;
    None when it is not critical or no batch request runs."""
    if _rank(priority) != RANK[CRITICAL]:
        return None
    ranks = [_rank(p) for p in running]
    if RANK[BATCH] not in ranks:
        return None
    return len(ranks) - 1 - ranks[::-1].index(RANK[BATCH])


def resumes_first(waiting: Sequence[str]) -> bool:
    """Whether a freed slot goes to a paused request (it holds its KV cache and was started
    before anyone waiting) rather than to the next waiting one: unless a critical one waits."""
    return all(_rank(p) != RANK[CRITICAL] for p in waiting)
