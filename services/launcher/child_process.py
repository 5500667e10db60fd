"""One child process of a locally started mesh: its command, log file, address and health
endpoint, how to start it with the parent's environment (stopped with its parent) and at what CPU
priority.

Knows subprocesses and files only; what runs in the child is the caller's business.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from services.common.cpu_priority import lower_priority
from services.common.parent_watch import child_environment

SERVICES_DIR = Path(__file__).resolve().parent.parent


@dataclass
class Child:
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
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        child_env = child_environment({**os.environ, **(self.env or {})})
        with self.log_path.open("ab" if append else "wb") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=SERVICES_DIR.parent,
                env=child_env,
            )
        lower_priority(self.process.pid, self.nice)

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
