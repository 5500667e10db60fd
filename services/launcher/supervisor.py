"""Keeps `tiermesh run`'s children alive: a child that exits is restarted after an exponential
backoff while the others keep serving, each restart is shown, and only a child that crashes
`max_crashes` times within `window_s` stops the whole mesh, with a message saying so. The
backoff grows only while a child crash-loops: one that had been serving for `stable_s` before it
died is restarted after the first backoff again. Every
child's pid is kept in the run directory's pids.json. Stopping goes front to back: the gateway
and the router first (they drain their clients), then the control plane and the tiers.

Knows processes, a health check handed in, and a console; nothing of what the children serve.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from rich.console import Console

from services.common.child_process import stop_processes
from services.launcher.json_file import write_json

FRONT = ("gateway", "router")  # stopped first, each drained before the next


class Process(Protocol):
    """What the supervisor needs of a child (services.common.child_process.Child)."""

    name: str
    address: str
    process: subprocess.Popen[bytes] | None

    def start(self, append: bool = False) -> None: ...

    def exited(self) -> int | None: ...

    def log_tail(self, lines: int = 15) -> str: ...


Child = TypeVar("Child", bound=Process)


@dataclass(frozen=True)
class RestartPolicy:
    base_s: float = 0.5  # first restart after this; doubles with each crash in a loop
    max_s: float = 8.0  # longest wait before a restart
    max_crashes: int = 5  # this many crashes of one child within window_s stop everything
    window_s: float = 60.0
    # a child that served this long before it crashed was not crash-looping: its restart waits
    # base_s again (the crash still counts toward max_crashes)
    stable_s: float = 10.0


@dataclass
class _ChildState:
    crashes: deque[float] = field(default_factory=deque)  # when it exited, within the window
    restart_at: float | None = None  # set while waiting to restart
    starting: bool = False  # restarted, not yet healthy again
    restarts: int = 0
    serving_since: float | None = None  # when a restart was seen healthy
    looping: int = 0  # crashes since the child last served for stable_s


class Supervisor(Generic[Child]):
    """Watches the children from `poll()`, called every few hundred milliseconds."""

    def __init__(
        self,
        children: Sequence[Child],
        healthy: Callable[[Child], bool],
        console: Console,
        pids_path: Path,
        policy: RestartPolicy | None = None,
    ) -> None:
        self._children = list(children)
        self._healthy = healthy
        self._console = console
        self._pids_path = pids_path
        self._policy = policy if policy is not None else RestartPolicy()
        self._states = {child.name: _ChildState() for child in children}
        self.write_pids()

    def write_pids(self) -> None:
        """Writes {name: pid} of the running children to pids.json (atomically)."""
        pids = {c.name: c.process.pid for c in self._children if c.process is not None}
        write_json(self._pids_path, pids)

    def poll(self, now: float | None = None) -> str | None:
        """Restarts what is due; returns why everything must stop, or None."""
        now = time.monotonic() if now is None else now
        for child in self._children:
            state = self._states[child.name]
            if state.restart_at is not None:
                if now >= state.restart_at:
                    self._restart(child, state)
                continue
            code = child.exited()
            if code is None:
                if state.starting and self._healthy(child):
                    state.starting = False
                    state.serving_since = now
                    self._console.print(
                        f"[green]✓[/green] {child.name} serving again on {child.address} "
                        f"(restart {state.restarts})"
                    )
                continue
            why = self._crashed(child, state, code, now)
            if why is not None:
                return why
        return None

    def _crashed(self, child: Child, state: _ChildState, code: int, now: float) -> str | None:
        policy = self._policy
        state.crashes.append(now)
        while state.crashes and now - state.crashes[0] > policy.window_s:
            state.crashes.popleft()
        how = _exit(code)
        self._console.print(f"[red]{child.name} {how}[/red]; log tail:")
        self._console.print(child.log_tail(), markup=False)
        if len(state.crashes) >= policy.max_crashes:
            return (
                f"{child.name} crashed {len(state.crashes)} times within "
                f"{policy.window_s:.0f} s (last: {how}); stopping every service"
            )
        stable = state.serving_since is not None and now - state.serving_since >= policy.stable_s
        state.looping = 1 if stable else state.looping + 1
        state.serving_since = None
        delay = min(policy.max_s, policy.base_s * 2 ** (state.looping - 1))
        state.restart_at = now + delay
        self._console.print(
            f"[yellow]restarting {child.name} in {delay:.1f} s[/yellow] "
            f"(crash {len(state.crashes)} of {policy.max_crashes} allowed "
            f"within {policy.window_s:.0f} s); the other services keep serving"
        )
        return None

    def _restart(self, child: Child, state: _ChildState) -> None:
        state.restart_at = None
        state.starting = True
        state.restarts += 1
        child.start(append=True)
        self.write_pids()
        pid = child.process.pid if child.process is not None else "?"
        self._console.print(f"{child.name} restarted (pid {pid}, restart {state.restarts})")


def _exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def stop_in_order(children: Sequence[Process], grace_s: float = 15.0) -> None:
    """SIGTERM to the gateway, then the router, each waited for (draining its clients), then
    to every other child at once (a child stopped by SIGSTOP is continued first); whatever
    outlives `grace_s` per step is killed."""
    front = [c for name in FRONT for c in children if c.name == name]
    rest = [c for c in children if c.name not in FRONT]
    for group in [[c] for c in front] + [rest]:
        stop_processes([c.process for c in group if c.process is not None], grace_s)
