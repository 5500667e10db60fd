"""Resident memory of the mesh's processes while chaos runs: first, last and peak RSS per
service, following a service across restarts (its current pid is read at each sample).

Reads /proc through services.bench.resources; knows nothing of faults or reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.bench.resources import process_memory
from services.common.child_process import Child


class MemoryWatch:
    """Resident memory of every child, sampled twice a second: first, last and peak."""

    def __init__(self, children: Sequence[Child]) -> None:
        self._children = children
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def sample(self) -> None:
        for child in self._children:
            if child.process is None:
                continue
            rss = process_memory(child.process.pid).get("rss")
            if rss is None:
                continue
            self.first.setdefault(child.name, rss)
            self.last[child.name] = rss
            self.peak[child.name] = max(rss, self.peak.get(child.name, 0))

    async def follow(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.5)
