"""The ADS wire handler (state of the world): one bidirectional stream per client carrying all
four resource types, answered from the snapshot cache.

Per type and stream it remembers the last response (version, nonce, names covered) and decides:
- a request whose nonce is the last response's is an ACK (no error_detail) or a NACK (with
  one); both are recorded, and neither is answered with a resend of the same version;
- a request with a stale nonce is never an ACK or NACK, but its names still count: what to send
  is decided from the names the last *response* covered, so a new subscription is answered even
  when it rides on a stale nonce;
- a response is sent when the type's version differs from the last one sent, or the client asks
  for a name the last response did not cover. LDS/CDS responses carry every subscribed name
  (leaving one out deletes it).
Knows nothing of topologies or how snapshots are built. Delta xDS is not served.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.discovery.v3 import (  # type: ignore[import-untyped]
    ads_pb2_grpc,
    discovery_pb2,
)
from google.protobuf import any_pb2

from mesh.node_status import NodeStatusBook
from mesh.resources import CLUSTER, LISTENER, SHORT_NAMES, TYPE_URLS
from mesh.snapshot import Snapshot, SnapshotCache

log = logging.getLogger(__name__)

WILDCARD_TYPES = (LISTENER, CLUSTER)  # an empty first request for these means "everything"


@dataclass
class _TypeState:
    """One resource type on one stream."""

    names: frozenset[str] = frozenset()
    wildcard: bool = False
    nonce: str = ""  # of the last response sent
    version: str = ""  # of the last response sent
    covered: frozenset[str] | None = frozenset()  # names it was built for; None = wildcard
    carried: tuple[str, ...] = ()  # names of the resources it carried

    def wants(self) -> frozenset[str] | None:
        return None if self.wildcard else self.names

    def needs_response(self, snapshot: Snapshot, type_url: str) -> bool:
        if not self.nonce:
            return True
        if snapshot.version_of(type_url) != self.version:
            return True
        if self.wildcard:
            return self.covered is not None
        return self.covered is not None and not self.names <= self.covered


class _AdsStream:
    """The state of one ADS stream; `handle` and `on_snapshot` return the responses to send."""

    _nonces = itertools.count(1)

    def __init__(self, cache: SnapshotCache, book: NodeStatusBook) -> None:
        self.cache = cache
        self.book = book
        self.node_id = ""
        self.group = ""
        self.snapshot: Snapshot | None = None
        self.types: dict[str, _TypeState] = {}

    def open(self, node: Any) -> None:
        self.node_id = node.id or "(no id)"
        self.group = self.cache.node_group(node)
        self.snapshot = self.cache.snapshot(self.group)
        self.book.stream_opened(self.node_id, self.group, node.user_agent_name)

    def handle(self, request: Any) -> list[Any]:
        type_url = request.type_url
        if type_url not in TYPE_URLS:
            log.warning("node %s asked for unknown type %r: ignored", self.node_id, type_url)
            return []
        first = type_url not in self.types
        state = self.types.setdefault(type_url, _TypeState())
        names = frozenset(request.resource_names)
        if "*" in names or (first and not names and type_url in WILDCARD_TYPES):
            state.wildcard = True
        state.names = names - {"*"}
        if request.response_nonce and request.response_nonce == state.nonce:
            if request.HasField("error_detail"):
                self._record_nack(type_url, state, request.error_detail.message)
            else:
                self.book.acked(self.node_id, type_url, request.version_info, state.carried)
        elif request.response_nonce:
            log.debug("node %s: stale nonce for %s", self.node_id, SHORT_NAMES[type_url])
        return self._respond([type_url])

    def _record_nack(self, type_url: str, state: _TypeState, detail: str) -> None:
        """The resources the client's message names are NACKED; the others of the response
        were accepted (gRPC applies the valid resources of a NACKed response)."""
        log.warning(
            "node %s NACKed %s version %s: %s",
            self.node_id,
            SHORT_NAMES[type_url],
            state.version,
            detail,
        )
        named = tuple(name for name in state.carried if name in detail) or state.carried
        self.book.nacked(self.node_id, type_url, state.version, detail, named)
        accepted = tuple(name for name in state.carried if name not in named)
        self.book.acked(self.node_id, type_url, state.version, accepted)

    def on_snapshot(self, snapshot: Snapshot) -> list[Any]:
        self.snapshot = snapshot
        return self._respond(list(self.types))

    def _respond(self, type_urls: list[str]) -> list[Any]:
        snapshot = self.snapshot
        if snapshot is None:
            return []
        responses = []
        for type_url in type_urls:
            state = self.types[type_url]
            if not state.needs_response(snapshot, type_url):
                continue
            resources = snapshot.named(type_url, state.wants())
            packed = []
            for message in resources.values():
                item = any_pb2.Any()
                item.Pack(message)
                packed.append(item)
            state.nonce = str(next(self._nonces))
            state.version = snapshot.version_of(type_url)
            state.covered = state.wants()
            state.carried = tuple(resources)
            responses.append(
                discovery_pb2.DiscoveryResponse(
                    version_info=state.version,
                    resources=packed,
                    type_url=type_url,
                    nonce=state.nonce,
                )
            )
            self.book.sent(self.node_id, type_url, state.version, state.carried)
        return responses

    def close(self) -> None:
        if self.node_id:
            self.book.stream_closed(self.node_id)


class AggregatedDiscoveryServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """envoy.service.discovery.v3.AggregatedDiscoveryService over grpc.aio."""

    def __init__(self, cache: SnapshotCache, book: NodeStatusBook) -> None:
        self.cache = cache
        self.book = book

    async def StreamAggregatedResources(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        stream = _AdsStream(self.cache, self.book)
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        reader = asyncio.create_task(_read(request_iterator, events))
        watcher: asyncio.Task[None] | None = None
        try:
            while True:
                kind, item = await events.get()
                if kind == "end":
                    return
                if kind == "snapshot":
                    responses = stream.on_snapshot(item)
                else:
                    if watcher is None:
                        stream.open(item.node)
                        watcher = asyncio.create_task(self._watch(stream, events))
                    responses = stream.handle(item)
                for response in responses:
                    yield response
        finally:
            reader.cancel()
            if watcher is not None:
                watcher.cancel()
            stream.close()

    async def _watch(self, stream: _AdsStream, events: asyncio.Queue[tuple[str, Any]]) -> None:
        seen = stream.snapshot
        while True:
            seen = await self.cache.wait_for_change(stream.group, seen)
            events.put_nowait(("snapshot", seen))

    async def DeltaAggregatedResources(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "delta xDS is not served: use SotW")
        yield  # pragma: no cover - makes this an async generator


async def _read(
    request_iterator: AsyncIterator[Any], events: asyncio.Queue[tuple[str, Any]]
) -> None:
    try:
        async for request in request_iterator:
            events.put_nowait(("request", request))
    except grpc.aio.AioRpcError:
        pass
    finally:
        events.put_nowait(("end", None))
