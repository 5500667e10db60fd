"""Ties a service process's life to the process that started it.

A launcher (`tiermesh run`, `tiermesh chaos`) or a test harness starts each child with
TIERMESH_STOP_WITH_PARENT set to its own pid (`child_environment`). The child then asks Linux
(prctl PR_SET_PDEATHSIG) to send it SIGTERM when that parent dies, so a launcher killed with
SIGKILL never leaves servers running behind it; SIGTERM lets the child drain as it would on
Ctrl-C. Without the variable, or off Linux, nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Mapping

ENV = "TIERMESH_STOP_WITH_PARENT"
_PR_SET_PDEATHSIG = 1

log = logging.getLogger(__name__)


def child_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` for a child that should stop when this process dies."""
    return {**environment, ENV: str(os.getpid())}


def stop_with_parent() -> bool:
    """Arranges SIGTERM for this process when the parent named by TIERMESH_STOP_WITH_PARENT
    dies; if that parent is already gone, sends it now. True when armed."""
    named = os.environ.get(ENV, "")
    if not named.isdigit() or not sys.platform.startswith("linux"):
        return False
    parent = int(named)
    if os.getppid() != parent and _alive(parent):
        return False  # the variable was inherited from further up: not this process's parent
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        log.warning("cannot tie this process to its parent: errno %d", ctypes.get_errno())
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
