"""Lower CPU priority (a higher nice value) for a process or, on Linux, one thread: how the
launcher starts tiers below the router and gateway, and how a tier runs its model's threads
below its own gRPC and event-loop threads.

On Linux a nice value belongs to a thread: `setpriority(PRIO_PROCESS, id)` with a thread id
lowers only that thread, and threads it starts later (torch's OpenMP team) inherit it. A process
id lowers the process's first thread, which every later thread inherits from. Elsewhere a thread
id would name some process, so threads are left alone there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

MAX_NICE = 19


def lower_priority(process_or_thread: int, levels: int) -> None:
    """Adds `levels` to the nice value of a process (or, on Linux, a thread) by its id, at most
    19; nothing for 0, or for an id that has already exited."""
    if levels <= 0:
        return
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, process_or_thread)
        os.setpriority(os.PRIO_PROCESS, process_or_thread, min(MAX_NICE, current + levels))


def lower_this_thread(levels: int) -> None:
    """`lower_priority` for the calling thread (a ThreadPoolExecutor initializer); Linux only."""
    if sys.platform == "linux":
        lower_priority(threading.get_native_id(), levels)
