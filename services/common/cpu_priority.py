"""Lower CPU priority (a higher nice value) for a process or, on Linux, one thread: how the
launcher starts tiers below the router and gateway, how a tier runs its model's threads below
its own gRPC and event-loop threads, and how a torch tier keeps its critical lane at the
priority it was started at while lowering everything else.

On Linux a nice value belongs to a thread: `setpriority(PRIO_PROCESS, id)` with a thread id
lowers only that thread, and threads it starts later (torch's OpenMP team) inherit it. A process
id lowers the process's first thread, which every later thread inherits from. Elsewhere a thread
id would name some process, so threads are left alone there. Raising a priority again takes a
privilege a service should not need, so a thread meant to stay high must be made by a thread
that still is: `lower_process` keeps one such thread, and `start_priority_executor` has it make
the executor's thread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

MAX_NICE = 19

_keeper: ThreadPoolExecutor | None = None  # a thread left at the start priority, once lowered
_keeper_lock = threading.Lock()


def lower_priority(process_or_thread: int, levels: int) -> None:
    """Adds `levels` to the nice value of a process (or, on Linux, a thread) by its id, at most
    19; nothing for 0, or for an id that has already exited."""
    if levels <= 0:
        return
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, process_or_thread)
        os.setpriority(os.PRIO_PROCESS, process_or_thread, min(MAX_NICE, current + levels))


def nice_level(value: str) -> int:
    """`--tier-nice N`, `--nice N`: a whole number of nice levels from 0 to 19 (argparse
    `type`)."""
    if not value.isdigit() or int(value) > MAX_NICE:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to 19, got {value!r}")
    return int(value)


def lower_this_thread(levels: int) -> None:
    """`lower_priority` for the calling thread (a ThreadPoolExecutor initializer); Linux only."""
    if sys.platform == "linux":
        lower_priority(threading.get_native_id(), levels)


def this_thread_nice() -> int:
    """The calling thread's nice value (on Linux; elsewhere the process's)."""
    if sys.platform == "linux":
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    return os.getpriority(os.PRIO_PROCESS, os.getpid())


def lower_process(levels: int) -> None:
    """Lowers this whole process `levels` nice levels (nothing for 0), every thread it has now
    and every one it starts later, but the threads `start_priority_executor` makes: on Linux one
    thread is kept at the priority the process had, idle, to make them. Call once, early."""
    global _keeper
    if levels <= 0:
        return
    if sys.platform != "linux":  # no per-thread priorities: the executors are lowered too
        lower_priority(os.getpid(), levels)
        return
    with _keeper_lock:
        if _keeper is not None:
            raise RuntimeError("lower_process: this process is already lowered")
        keeper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="start-priority")
        keeper_id = keeper.submit(threading.get_native_id).result()
        for task in os.listdir("/proc/self/task"):
            if int(task) != keeper_id:
                lower_priority(int(task), levels)
        _keeper = keeper


def start_priority_executor(thread_name_prefix: str) -> ThreadPoolExecutor:
    """A one-thread executor whose thread runs at the priority this process started at, above
    the rest of it, when made after `lower_process` (one made before is lowered with the rest;
    without it, the calling thread's priority). For short work that must not wait behind the
    process's own: a torch tier's critical lane."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name_prefix)
    with _keeper_lock:
        keeper = _keeper
    if keeper is not None:  # its thread is started by (so inherits the priority of) the keeper
        keeper.submit(lambda: executor.submit(int).result()).result()
    return executor
