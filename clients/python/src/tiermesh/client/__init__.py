"""tiermesh's Python client: call the router from any service, with only grpcio and protobuf.

    from tiermesh.client import RouterClient

    with RouterClient("127.0.0.1:50051") as client:
        result = client.chat("What is your return policy?", mode="progressive")
        print(result.text, result.tier, result.revision)

AsyncRouterClient has the same methods for asyncio. Failures raise ChatError. The generated
stubs are in tiermesh.v1 (router_pb2, router_pb2_grpc, tier_pb2, common_pb2, mesh_pb2).
"""

from tiermesh.client.errors import ChatError
from tiermesh.client.events import (
    ChatResult,
    DeltaEvent,
    Event,
    FinalEvent,
    RevisionEndEvent,
    RevisionStartEvent,
    RouteEvent,
    TokenLogprob,
    TopLogprob,
    event_from_proto,
    event_to_json,
)
from tiermesh.client.requests import MODES, build_request
from tiermesh.client.router_client import (
    AsyncRouterClient,
    RouterClient,
    router_address,
    tls_credentials,
)

__all__ = [
    "MODES",
    "AsyncRouterClient",
    "ChatError",
    "ChatResult",
    "DeltaEvent",
    "Event",
    "FinalEvent",
    "RevisionEndEvent",
    "RevisionStartEvent",
    "RouteEvent",
    "RouterClient",
    "TokenLogprob",
    "TopLogprob",
    "build_request",
    "event_from_proto",
    "event_to_json",
    "router_address",
    "tls_credentials",
]
