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

A process that keeps many streams open (the router) also lets its youngest generation hold more
new objects before a pass (`young_objects`; CPython's default is 700): each open stream holds
~135 tracked objects (grpc's call state, tasks, async generators) that live as long as the
stream, so with the default every one of them is promoted and traversed again by the older
generations' passes. At 1,000 streams the router's passes then took 15-35 ms (the second
generation) and 50-66 ms (full) of CPU, each one stopping the event loop. With 20,000 the
router spends 5% less CPU per chat there (README, Performance).
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


def freeze_heap(young_objects: int | None = None) -> HeapFreeze:
    """Collects the garbage there is, then freezes every object still alive (see the module
    docstring); with `young_objects`, the youngest generation is collected once that many new
    objects are tracked (the older generations' thresholds kept). Call it once a service is
    ready to serve, in its own process only: a library or a test process would keep its frozen
    cycles for good."""
    started = time.perf_counter()
    collected = gc.collect()
    gc.freeze()
    if young_objects is not None:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_objects, middle, old)
    return HeapFreeze(gc.get_freeze_count(), collected, time.perf_counter() - started)
