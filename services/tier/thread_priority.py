"""Lower CPU priority for a tier's compute threads, so the same process's gRPC and event-loop
threads (admission, refusals, load reports, streaming) run as soon as they wake.

On Linux a nice value belongs to a thread: `setpriority(PRIO_PROCESS, thread id)` lowers only the
calling thread, and threads it starts later (torch's OpenMP team) inherit it. Elsewhere nothing
is changed, since there the id would name a process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

MAX_NICE = 19


def lower_this_thread(levels: int) -> None:
    """Adds `levels` to the calling thread's nice value (at most 19); a no-op for 0 or off Linux."""
    if levels <= 0 or sys.platform != "linux":
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(MAX_NICE, current + levels))


def thread_nice(thread_id: int) -> int:
    """A thread's nice value by its native id (Linux)."""
    return os.getpriority(os.PRIO_PROCESS, thread_id)
