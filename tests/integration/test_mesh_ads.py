"""The ADS wire protocol of the control plane, driven request by request over a real gRPC
stream: ACK and NACK per type, no resend after a NACK, subscription changes on stale nonces,
wildcards, and the record of what each node ACKed or NACKed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.rpc import status_pb2

from mesh.control_plane import RunningControlPlane, start_control_plane
from mesh.node_status import ACKED, NACKED
from mesh.resources import CLUSTER, ENDPOINT, LISTENER
from mesh.topology_file import parse_topology

TOPOLOGY = """\
tiers:
  large:
    clusters:
      - {name: large-v1, weight: 80, endpoints: [{address: 127.0.0.1:50063}]}
      - {name: large-v2, weight: 20, endpoints: [{address: 127.0.0.1:50064}]}
"""


class AdsClient:
    """One ADS stream, written to and read from explicitly."""

    def __init__(self, address: str, node_id: str = "test-node") -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.node = base_pb2.Node(id=node_id, user_agent_name="ads-test")
        self.outbox: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()
        self.call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(
            self.channel
        ).StreamAggregatedResources(self._requests())
        self.sent_node = False
        self.inbox: asyncio.Queue[discovery_pb2.DiscoveryResponse] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for response in self.call:
            self.inbox.put_nowait(response)

    async def _requests(self) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while (request := await self.outbox.get()) is not None:
            yield request

    def send(
        self, type_url: str, names: list[str], version: str = "", nonce: str = "", error: str = ""
    ) -> None:
        request = discovery_pb2.DiscoveryRequest(
            type_url=type_url, resource_names=names, version_info=version, response_nonce=nonce
        )
        if not self.sent_node:
            request.node.CopyFrom(self.node)
            self.sent_node = True
        if error:
            request.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
        self.outbox.put_nowait(request)

    async def receive(self, timeout_s: float = 2.0) -> discovery_pb2.DiscoveryResponse:
        return await asyncio.wait_for(self.inbox.get(), timeout_s)

    async def nothing_within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.inbox.get(), seconds)
        except TimeoutError:
            return True
        return False

    async def close(self) -> None:
        self.outbox.put_nowait(None)
        self.call.cancel()
        self.reader.cancel()
        await self.channel.close()


def names_of(response: discovery_pb2.DiscoveryResponse) -> set[str]:
    from envoy.config.cluster.v3 import cluster_pb2
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.config.listener.v3 import listener_pb2

    kinds = {
        LISTENER: (listener_pb2.Listener, "name"),
        CLUSTER: (cluster_pb2.Cluster, "name"),
        ENDPOINT: (endpoint_pb2.ClusterLoadAssignment, "cluster_name"),
    }
    cls, field = kinds[response.type_url]
    names = set()
    for packed in response.resources:
        message = cls()
        packed.Unpack(message)
        names.add(getattr(message, field))
    return names


@pytest.fixture
async def plane() -> AsyncIterator[RunningControlPlane]:
    started = await start_control_plane(None, topology=parse_topology(TOPOLOGY))
    yield started
    await started.stop()


@pytest.fixture
async def client(plane: RunningControlPlane) -> AsyncIterator[AdsClient]:
    ads = AdsClient(plane.address)
    yield ads
    await ads.close()


async def test_ack_is_recorded_and_nack_is_never_resent(
    plane: RunningControlPlane, client: AdsClient
) -> None:
    client.send(CLUSTER, ["large-v1"])
    first = await client.receive()
    assert first.version_info == "1" and names_of(first) == {"large-v1"}
    client.send(CLUSTER, ["large-v1"], version="1", nonce=first.nonce)
    assert await client.nothing_within(0.2)
    record = plane.plane.book.node("test-node").types[CLUSTER]
    assert (record.state, record.acked_version) == (ACKED, "1")

    plane.plane.publish(parse_topology(TOPOLOGY.replace("weight: 80", "weight: 70")))
    plane.plane.publish(
        parse_topology(TOPOLOGY.replace("large-v1,", "large-v1, lb_policy: ring_hash,"))
    )
    second = await client.receive()
    assert second.version_info == "3"
    client.send(CLUSTER, ["large-v1"], version="1", nonce=second.nonce, error="bad lb_policy")
    assert await client.nothing_within(0.3), "a NACKed version was sent again"
    record = plane.plane.book.node("test-node").types[CLUSTER]
    assert record.state == NACKED
    resource = record.resources["large-v1"]
    assert (resource.nacked_version, resource.nack_detail) == ("3", "bad lb_policy")
    assert resource.acked_version == "1"

    plane.plane.publish(parse_topology(TOPOLOGY))  # a fixed topology is sent, and ACKed
    third = await client.receive()
    assert third.version_info == "4"
    client.send(CLUSTER, ["large-v1"], version="4", nonce=third.nonce)
    await asyncio.sleep(0.05)
    assert plane.plane.book.node("test-node").types[CLUSTER].state == ACKED


async def test_subscription_change_on_a_stale_nonce_is_answered(
    plane: RunningControlPlane, client: AdsClient
) -> None:
    client.send(ENDPOINT, ["large-v1"])
    first = await client.receive()
    plane.plane.publish(parse_topology(TOPOLOGY.replace("50063", "50065")))
    second = await client.receive()
    assert names_of(second) == {"large-v1"}
    # The client had not seen `second` yet: it asks for one more name on the old nonce.
    client.send(ENDPOINT, ["large-v1", "large-v2"], version="1", nonce=first.nonce)
    third = await client.receive()
    assert names_of(third) == {"large-v1", "large-v2"}
    record = plane.plane.book.node("test-node").types[ENDPOINT]
    assert record.acked_version == "", "a stale nonce must not count as an ACK"
    client.send(ENDPOINT, ["large-v1", "large-v2"], version=third.version_info, nonce=third.nonce)
    assert await client.nothing_within(0.2)


async def test_lds_and_cds_answer_every_subscribed_name_and_wildcards(
    plane: RunningControlPlane, client: AdsClient
) -> None:
    client.send(CLUSTER, [])  # first request with no names: everything
    response = await client.receive()
    assert names_of(response) == {"large-v1", "large-v2"}
    client.send(LISTENER, ["tier-large", "tier-unknown"])
    listeners = await client.receive()
    assert names_of(listeners) == {"tier-large"}
    client.send(LISTENER, ["tier-large", "tier-unknown"], version="1", nonce=listeners.nonce)
    client.send(CLUSTER, [], version="1", nonce=response.nonce)
    plane.plane.publish(
        parse_topology(TOPOLOGY.replace("large-v2,", "large-v2, lb_policy: ring_hash,"))
    )
    update = await client.receive()
    assert update.type_url == CLUSTER and names_of(update) == {"large-v1", "large-v2"}
    assert await client.nothing_within(0.2), "listeners did not change and must not be resent"


async def test_delta_xds_is_refused(plane: RunningControlPlane) -> None:
    async with grpc.aio.insecure_channel(plane.address) as channel:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).DeltaAggregatedResources(
            iter([discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER)])
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
