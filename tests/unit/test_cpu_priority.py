"""cpu_priority in a real child process (it lowers the whole process): `lower_process` lowers
every thread the process has (an executor made before included) and starts later, but
`start_priority_executor`'s threads made after it, by the one thread it keeps at the start
priority; and the `--nice` value type. Linux only (a nice
value is per thread there)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from services.common.cpu_priority import MAX_NICE, nice_level

CHILD = """
import json, os, threading
from concurrent.futures import ThreadPoolExecutor
from services.common.cpu_priority import lower_process, start_priority_executor, this_thread_nice

before = ThreadPoolExecutor(1)  # a thread the process had when it was lowered
before.submit(int).result()
early_lane = start_priority_executor("early")  # made before: lowered with the rest
lower_process(LEVELS)
later = ThreadPoolExecutor(1)  # started after: inherits the lowered priority
lane = start_priority_executor("lane")
lane_again = start_priority_executor("lane-2")  # a second one (a hot-swapped model's lane)
seen = {
    "main": this_thread_nice(),
    "before": before.submit(this_thread_nice).result(),
    "later": later.submit(this_thread_nice).result(),
    "lane": lane.submit(this_thread_nice).result(),
    "lane_again": lane_again.submit(this_thread_nice).result(),
    "early_lane": early_lane.submit(this_thread_nice).result(),
    "threads": sorted(
        os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")
    ),
}
try:
    lower_process(1)
    seen["twice"] = "allowed"
except RuntimeError as e:
    seen["twice"] = str(e)
print(json.dumps(seen))
"""


def run_child(levels: int) -> dict[str, object]:
    code = CHILD.replace("LEVELS", str(levels))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")
def test_lower_process_keeps_only_the_start_priority_executors_up() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    low = min(own + 6, MAX_NICE)
    seen = run_child(6)
    assert seen["main"] == seen["before"] == seen["later"] == seen["early_lane"] == low
    assert seen["lane"] == seen["lane_again"] == own
    # the two lanes and the keeper at the start priority, every other thread lowered
    threads = seen["threads"]
    assert isinstance(threads, list)
    assert threads.count(own) == 3 and set(threads) == {own, low}
    assert seen["twice"] == "lower_process: this process is already lowered"


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")
def test_no_levels_leaves_the_process_and_keeps_no_thread() -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)
    seen = run_child(0)
    assert seen["main"] == seen["later"] == seen["lane"] == own
    threads = seen["threads"]
    assert isinstance(threads, list)
    assert set(threads) == {own} and len(threads) == 6  # main, before, later and 3 lanes
    assert seen["twice"] == "allowed"  # not lowered yet: the first call with levels does


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", 0), ("10", 10), ("19", 19), ("20", None), ("-1", None), ("ten", None), ("", None)],
)
def test_nice_level_accepts_0_to_19(value: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(argparse.ArgumentTypeError, match="from 0 to 19"):
            nice_level(value)
    else:
        assert nice_level(value) == expected
