"""A service's file descriptors: the soft RLIMIT_NOFILE raised to the hard limit at start
(`raise_open_files_limit`), how many are open now (`open_descriptors`), and the rule that keeps
connection caps under the limit (`connection_cap`), so a service at its cap still has descriptors
for its own files, upstream channels, health checks and the refusals it is sending.

Knows the process's resource limits and /proc; nothing of servers or protocols.
"""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)

# a connection cap never takes more than this share of the soft limit: the rest is the service's
# own (logs, model files, channels to other services, health checks, connections being refused)
CAP_SHARE = 0.75
# ...and never leaves fewer than this many descriptors outside the cap
MIN_RESERVE = 64
# Linux refuses a soft limit above fs.nr_open even when the hard limit says "unlimited"
_NR_OPEN = "/proc/sys/fs/nr_open"
_FD_DIRS = ("/proc/self/fd", "/dev/fd")


@dataclass(frozen=True)
class DescriptorLimit:
    """RLIMIT_NOFILE before and after `raise_open_files_limit` (None: unlimited)."""

    soft_before: int | None
    soft: int | None
    hard: int | None

    def describe(self) -> str:
        def show(value: int | None) -> str:
            return "unlimited" if value is None else str(value)

        raised = "" if self.soft == self.soft_before else f"{show(self.soft_before)} -> "
        return f"open files: soft limit {raised}{show(self.soft)}, hard {show(self.hard)}"


def _limit(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else value


def raise_open_files_limit() -> DescriptorLimit:
    """Raises this process's soft RLIMIT_NOFILE to its hard limit (to fs.nr_open where the hard
    limit is unlimited) and returns both, before and after. Never fails: where the limit cannot
    be raised it stays as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open(_NR_OPEN) as f:
                wanted = int(f.read())
        except (OSError, ValueError):
            wanted = soft
    raised = soft
    if soft != resource.RLIM_INFINITY and wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            raised = wanted
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, wanted, e)
    return DescriptorLimit(_limit(soft), _limit(raised), _limit(hard))


def open_descriptors() -> int | None:
    """How many file descriptors this process has open (None where the system cannot say)."""
    for path in _FD_DIRS:
        try:
            return len(os.listdir(path)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return None


def process_descriptors(pid: int) -> int | None:
    """How many file descriptors process `pid` has open (Linux; None if it cannot be read)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def connection_cap(configured: int, soft_limit: int | None) -> int:
    """`configured`, lowered where it would leave the service too few descriptors of its own:
    at most CAP_SHARE of the soft limit and MIN_RESERVE under it (at least 1)."""
    if soft_limit is None:
        return configured
    room = min(int(soft_limit * CAP_SHARE), soft_limit - MIN_RESERVE)
    return max(1, min(configured, room))
