"""freeze_heap: start-up garbage is collected, what is alive is frozen, and frozen objects are
still freed by reference counting."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.common.heap import freeze_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()  # this test process is not a service: give its heap back to the collector


def test_garbage_cycles_are_collected_and_live_objects_frozen(unfrozen_after: None) -> None:
    gc.unfreeze()
    first, second = Node(), Node()
    first.other, second.other = second, first  # a cycle only the collector can free
    cycle = weakref.ref(first)
    del first, second
    kept = Node()

    result = freeze_heap()

    assert cycle() is None, "the garbage cycle was frozen instead of collected"
    assert result.collected >= 2
    # frozen objects that die afterwards (another thread's, this frame's) leave the count
    assert result.frozen > 0
    assert 0 < gc.get_freeze_count() <= result.frozen
    assert result.seconds >= 0
    assert gc.is_tracked(kept)
    # a frozen object without a cycle is still freed when its last reference goes
    alive = weakref.ref(kept)
    del kept
    assert alive() is None


def test_young_objects_sets_only_the_youngest_generations_threshold(unfrozen_after: None) -> None:
    before = gc.get_threshold()
    try:
        freeze_heap(young_objects=20_000)
        assert gc.get_threshold() == (20_000, before[1], before[2])
        freeze_heap()  # without it, the thresholds stay as they are
        assert gc.get_threshold() == (20_000, before[1], before[2])
    finally:
        gc.set_threshold(*before)
