"""What each xDS client (node) was sent and what it said back, per resource: the version sent,
the version it ACKed, and the version it NACKed with the client's reason.

Kept per (type, resource name) because one node may hold several ADS streams (grpcio opens one
per `xds:///` target), each subscribed to different names. Written by the ADS streams, read by
the admin service. Knows nothing of streams or messages beyond node ids, type URLs and names.
Thread-safety: one asyncio event loop, like the cache.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

ACKED = "ACKED"
NACKED = "NACKED"
PENDING = "PENDING"  # sent, no answer yet
_SEVERITY = {ACKED: 0, PENDING: 1, NACKED: 2}


def _newest(versions: Iterable[str]) -> str:
    return max(versions, key=lambda v: (len(v), v), default="")


def _oldest(versions: Iterable[str]) -> str:
    return min(versions, key=lambda v: (len(v), v), default="")


@dataclass
class ResourceRecord:
    """One node's state for one resource."""

    name: str
    sent_version: str = ""
    sent_at: float = 0.0
    acked_version: str = ""
    nacked_version: str = ""  # the version the client refused (it keeps its previous one)
    nack_detail: str = ""  # the client's error_detail message
    nacked_at: float = 0.0

    @property
    def state(self) -> str:
        if self.sent_version and self.nacked_version == self.sent_version:
            return NACKED
        if self.sent_version and self.acked_version == self.sent_version:
            return ACKED
        return PENDING


@dataclass
class TypeRecord:
    """One node's resources of one type, and their state summed up."""

    type_url: str
    resources: dict[str, ResourceRecord] = field(default_factory=dict)

    def of(self, name: str) -> ResourceRecord:
        return self.resources.setdefault(name, ResourceRecord(name))

    @property
    def resource_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.resources))

    @property
    def state(self) -> str:
        """The worst of its resources: NACKED, then PENDING, then ACKED."""
        states = [r.state for r in self.resources.values()] or [PENDING]
        return max(states, key=_SEVERITY.__getitem__)

    @property
    def sent_version(self) -> str:
        return _newest(r.sent_version for r in self.resources.values())

    @property
    def acked_version(self) -> str:
        """The version every resource has ACKed (the oldest ACK), "" if one has none."""
        acked = [r.acked_version for r in self.resources.values()]
        return "" if not acked or "" in acked else _oldest(acked)

    @property
    def last_nack(self) -> ResourceRecord | None:
        nacked = [r for r in self.resources.values() if r.nacked_version]
        return max(nacked, key=lambda r: r.nacked_at, default=None)


@dataclass
class NodeRecord:
    node_id: str
    group: str
    user_agent: str
    streams: int = 0  # ADS streams open now
    last_seen: float = field(default_factory=time.time)
    types: dict[str, TypeRecord] = field(default_factory=dict)

    def of_type(self, type_url: str) -> TypeRecord:
        return self.types.setdefault(type_url, TypeRecord(type_url))


class NodeStatusBook:
    """Records per node id. A node that reconnects keeps its record (and history)."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeRecord] = {}

    def nodes(self) -> list[NodeRecord]:
        return [self._nodes[node_id] for node_id in sorted(self._nodes)]

    def node(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    def stream_opened(self, node_id: str, group: str, user_agent: str) -> None:
        record = self._touch(node_id)
        record.group, record.user_agent = group, user_agent
        record.streams += 1

    def stream_closed(self, node_id: str) -> None:
        record = self._touch(node_id)
        record.streams = max(0, record.streams - 1)

    def sent(self, node_id: str, type_url: str, version: str, names: Iterable[str]) -> None:
        of_type = self._touch(node_id).of_type(type_url)
        now = time.time()
        for name in names:
            record = of_type.of(name)
            record.sent_version, record.sent_at = version, now

    def acked(self, node_id: str, type_url: str, version: str, names: Iterable[str]) -> None:
        of_type = self._touch(node_id).of_type(type_url)
        for name in names:
            of_type.of(name).acked_version = version

    def nacked(
        self, node_id: str, type_url: str, version: str, detail: str, names: Iterable[str]
    ) -> None:
        of_type = self._touch(node_id).of_type(type_url)
        now = time.time()
        for name in names:
            record = of_type.of(name)
            record.nacked_version, record.nack_detail, record.nacked_at = version, detail, now

    def _touch(self, node_id: str) -> NodeRecord:
        record = self._nodes.setdefault(node_id, NodeRecord(node_id, "", ""))
        record.last_seen = time.time()
        return record
