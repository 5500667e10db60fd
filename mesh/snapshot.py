"""State of the control plane: immutable, versioned snapshots of xDS resources, one per node
group, and the cache that publishes them and wakes the streams that wait for a change.

A snapshot is checked before it is published: every listener's route configuration, every
route's clusters and every cluster's endpoints must be in it, or it is refused and the previous
one keeps serving. Knows nothing of gRPC streams, nonces or ACKs (see `mesh.ads`), nor of
topology files (see `mesh.control_plane`).

Thread-safety: a SnapshotCache belongs to one asyncio event loop; call it from that loop only.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from google.protobuf.message import Message

from mesh.resources import REFERENCED_TYPE, SHORT_NAMES, TYPE_URLS, references

DEFAULT_GROUP = "default"


class InconsistentSnapshot(ValueError):
    """A snapshot names a resource it does not contain; it was not published."""


def _digest(resources: Mapping[str, Message]) -> str:
    hasher = hashlib.sha256()
    for name in sorted(resources):
        hasher.update(name.encode())
        hasher.update(resources[name].SerializeToString(deterministic=True))
    return hasher.hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """A complete, immutable set of resources by type URL and name, with a version per type.

    Build one with `Snapshot.of`; never mutate the messages it holds.
    """

    resources: Mapping[str, Mapping[str, Message]]
    versions: Mapping[str, str]
    digests: Mapping[str, str]
    label: str = ""  # what it was built from, for status output (e.g. the topology version)

    @classmethod
    def of(
        cls, version: str, resources: Mapping[str, Mapping[str, Message]], label: str = ""
    ) -> Snapshot:
        frozen = {
            type_url: MappingProxyType(dict(resources.get(type_url, {}))) for type_url in TYPE_URLS
        }
        return cls(
            resources=MappingProxyType(frozen),
            versions=MappingProxyType({type_url: version for type_url in TYPE_URLS}),
            digests=MappingProxyType({t: _digest(r) for t, r in frozen.items()}),
            label=label,
        )

    @property
    def version(self) -> str:
        """The newest of the per-type versions (versions are increasing integers as text)."""
        return max(self.versions.values(), key=lambda v: (len(v), v))

    def version_of(self, type_url: str) -> str:
        return self.versions[type_url]

    def named(self, type_url: str, names: frozenset[str] | None) -> dict[str, Message]:
        """The resources of a type whose names are in `names` (all of them for None)."""
        of_type = self.resources.get(type_url, {})
        if names is None:
            return dict(of_type)
        return {name: of_type[name] for name in sorted(names) if name in of_type}

    def check_consistent(self) -> None:
        """Raises InconsistentSnapshot naming every missing reference (go-control-plane's
        Consistent(), plus route -> cluster)."""
        missing: list[str] = []
        for type_url, target_type in REFERENCED_TYPE.items():
            available = self.resources.get(target_type, {})
            for name, resource in self.resources.get(type_url, {}).items():
                for wanted in references(type_url, resource):
                    if wanted not in available:
                        missing.append(
                            f"{SHORT_NAMES[type_url]} {name!r} needs "
                            f"{SHORT_NAMES[target_type]} {wanted!r}"
                        )
        if missing:
            raise InconsistentSnapshot("; ".join(missing))

    def carrying_versions(self, previous: Snapshot | None) -> Snapshot:
        """This snapshot with each type whose resources did not change keeping the previous
        version, so streams resend only the types that changed."""
        if previous is None:
            return self
        versions = {
            type_url: previous.versions[type_url]
            if previous.digests.get(type_url) == self.digests[type_url]
            else version
            for type_url, version in self.versions.items()
        }
        return Snapshot(self.resources, MappingProxyType(versions), self.digests, self.label)


NodeGroup = Callable[[Any], str]  # envoy.config.core.v3.Node -> group key


def single_group(_node: Any) -> str:
    """Every node in one group: the default node-group function."""
    return DEFAULT_GROUP


@dataclass
class SnapshotCache:
    """The published snapshot of each node group. `set_snapshot` checks, versions and publishes;
    `wait_for_change` is what an ADS stream awaits. Cancelling a waiter is safe."""

    node_group: NodeGroup = single_group
    _snapshots: dict[str, Snapshot] = field(default_factory=dict)
    _changed: dict[str, asyncio.Event] = field(default_factory=dict)

    def set_snapshot(self, group: str, snapshot: Snapshot) -> Snapshot:
        """Publishes `snapshot` for `group` and returns it as published (with carried-over
        versions). Raises InconsistentSnapshot and publishes nothing if it is inconsistent."""
        snapshot.check_consistent()
        published = snapshot.carrying_versions(self._snapshots.get(group))
        self._snapshots[group] = published
        event = self._changed.pop(group, None)
        if event is not None:
            event.set()
        return published

    def snapshot(self, group: str) -> Snapshot | None:
        return self._snapshots.get(group)

    async def wait_for_change(self, group: str, seen: Snapshot | None) -> Snapshot:
        """Returns the group's snapshot as soon as it is not `seen` (at once if it already
        differs)."""
        while True:
            current = self._snapshots.get(group)
            if current is not None and current is not seen:
                return current
            event = self._changed.setdefault(group, asyncio.Event())
            await event.wait()
