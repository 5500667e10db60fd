"""Child processes of a tiermesh command, script or test: started from the repository root with
this process's environment, told to stop when this process dies (services.common.parent_watch),
their output in a log file, at a CPU priority (`spawn`, and `Child`: one named child with an
address, started again on a restart); stopped with SIGTERM, then SIGKILL after a grace period
(`stop_process`, `stop_processes`).

Knows subprocesses, signals and files only; what runs in the child, and how it says it is
healthy, is the caller's business.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.cpu_priority import lower_priority
from services.common.parent_watch import child_environment

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES_DIR = REPO_ROOT / "services"


def spawn(
    command: Sequence[str],
    log_path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO_ROOT,
    append: bool = False,
    nice: int = 0,
) -> subprocess.Popen[bytes]:
    """Starts `command` in `cwd` with `env` (default: this process's environment), stopped with
    this process (SIGTERM when it dies); stdout and stderr go to `log_path` (created with its
    folder; `append` keeps an earlier run's lines), or nowhere without one. `nice` levels are
    added to the child's nice value (a lower CPU priority) when above 0."""
    child_env = child_environment(os.environ if env is None else env)
    if log_path is None:
        process = subprocess.Popen(
            list(command),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=child_env,
        )
    else:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab" if append else "wb") as log:
            process = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=child_env
            )
    lower_priority(process.pid, nice)
    return process


def stop_processes(
    processes: Sequence[subprocess.Popen[Any]],
    grace_s: float = 15.0,
    sig: signal.Signals = signal.SIGTERM,
) -> None:
    """Sends `sig` to every process still running, all at once (SIGCONT first: a process stopped
    with SIGSTOP cannot act on it), waits up to `grace_s` in all for them to exit, then kills
    those left. Output piped to this process is read to its end and dropped, and the pipes
    closed, so no child blocks on a full pipe while it stops."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.send_signal(sig)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def stop_process(
    process: subprocess.Popen[Any], grace_s: float = 15.0, sig: signal.Signals = signal.SIGTERM
) -> None:
    """`stop_processes` for one process."""
    stop_processes([process], grace_s, sig)


@dataclass
class Child:
    """One named child: its command, log file, address and health endpoint, how it starts (again,
    on a restart) and stops."""

    name: str
    address: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # added to this process's environment
    health_url: str | None = None  # HTTP health endpoint; None = gRPC health at `address`
    nice: int = 0  # added to the process's nice value (a lower CPU priority) when above 0

    def start(self, append: bool = False) -> None:
        """Starts the process; `append` keeps the log of an earlier run (a restart)."""
        env = {**os.environ, **(self.env or {})}
        self.process = spawn(self.command, self.log_path, env=env, append=append, nice=self.nice)

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, sig: signal.Signals) -> None:
        """Sends `sig` to the process if it is running."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if the process outlives `grace_s`; nothing if it never ran."""
        if self.process is not None:
            stop_process(self.process, grace_s)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
