"""Keeps the garbage collector's full passes short in a serving process: once a service has
started, everything it built to get there (imported modules, a loaded model, its server) is
moved out of the cyclic collector's reach.

CPython's collector scans every tracked object on a full (generation 2) pass. A tier with torch
and transformers imported holds about 200,000 of them and a full pass there took 150-550 ms on a
2-core AMD EPYC; the router's took 50-75 ms. Such a pass stops the event
loop, so it lands on whatever is in flight: a refusal, a token, a failover. `gc.freeze()` moves
the objects alive now to a permanent generation that no pass scans; reference counting still
frees them when they are dropped (a swapped-out model is), only a reference cycle among frozen
objects outlives its last outside reference. Collected first, so that the garbage of start-up
(import-time cycles) is freed rather than kept.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class HeapFreeze:
    """What `freeze_heap` did: the objects it froze, the garbage it collected first, and the
    seconds both took."""

    frozen: int
    collected: int
    seconds: float


def freeze_heap() -> HeapFreeze:
    """Collects the garbage there is, then freezes every object still alive (see the module
    docstring). Call it once a service is ready to serve, in its own process only: a library
    or a test process would keep its frozen cycles for good."""
    started = time.perf_counter()
    collected = gc.collect()
    gc.freeze()
    return HeapFreeze(gc.get_freeze_count(), collected, time.perf_counter() - started)
