"""A tier's cold start, phase by phase: from the process's start to SERVING.

Reads the process's age from Linux's /proc (none elsewhere) and the phases an engine timed
itself (its `startup_s`, when it has one). Knows nothing of gRPC or of how an engine loads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


def process_age_s() -> float | None:
    """Seconds since this process started (10 ms resolution), or None where /proc is absent."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # the command name (field 2) may hold spaces: the fields after it follow its ")"
            fields = stat.read().rsplit(")", 1)[1].split()
            started_ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
            up_s = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, up_s - started_ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class StartupRecord:
    """Phases of one tier's start-up, in order, and how its weights were read.

    `imports_s` is the time before the tier's start-up began (None when the tier runs inside
    another program, where the process's age says nothing about the tier)."""

    imports_s: float | None = None
    weights_loading: str = ""
    began: float = field(default_factory=time.perf_counter)
    phases: list[tuple[str, float]] = field(default_factory=list)
    total_s: float = 0.0

    def serving(self, engine_phases: dict[str, float]) -> None:
        """Records the engine's own phases and the total, at the moment the tier is SERVING."""
        elapsed = time.perf_counter() - self.began
        self.phases = [("imports", self.imports_s)] if self.imports_s is not None else []
        self.phases += list(engine_phases.items())
        self.total_s = elapsed + (self.imports_s or 0.0)

    def describe(self) -> str:
        """One line for a log or a table: "12.3 s (imports 8.0 s, weights 3.1 s, ...)"."""
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases)
        return f"{self.total_s:.1f} s ({parts})" if parts else f"{self.total_s:.1f} s"
