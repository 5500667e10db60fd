"""The floor the router's hop is measured against: the least a RouterService can do on this host
and still keep the wire contract. Per chat it makes one TierService.Generate call to one fixed
tier, writes RouteDecision while that call is in flight, then RevisionStart with the tier's
first chunk, a Delta per chunk and Final: the events a pinned chat gets from the router, with no
routing policy, admission, health, fallback, telemetry or validation. Its server and tier
channel take the services' shared gRPC options, as the router's do. `scripts/hop_latency.py`
times it beside the router, so "what the router adds" and "what any gRPC relay here adds" come
from one run.

Never a service: it trusts its input and speaks plaintext only. Knows the tier's and router's
stubs; nothing of the router's code (it must not share the router's costs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from tiermesh.v1 import common_pb2, router_pb2, router_pb2_grpc, tier_pb2, tier_pb2_grpc

from services.common.grpc_service import CHANNEL_OPTIONS, SERVER_OPTIONS

DEFAULT_MAX_TOKENS = 128  # the router's default_max_tokens


class RelayFloor(router_pb2_grpc.RouterServiceServicer):
    """RouterService.Chat relayed to one tier, named `tier` in the events."""

    def __init__(self, tier_address: str, tier: str = "small") -> None:
        self._channel = grpc.aio.insecure_channel(tier_address, options=CHANNEL_OPTIONS)
        self._stub = tier_pb2_grpc.TierServiceStub(self._channel)
        self._tier = tier

    async def Chat(
        self, request: router_pb2.ChatRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[router_pb2.ChatEvent]:
        request_id = request.request_id or uuid.uuid4().hex  # as the router names a chat
        messages = request.messages or [common_pb2.ChatMessage(role="user", content=request.prompt)]
        max_tokens = request.max_tokens if request.HasField("max_tokens") else DEFAULT_MAX_TOKENS
        call = self._stub.Generate(
            tier_pb2.GenerateRequest(
                request_id=request_id, messages=messages, max_tokens=max_tokens
            )
        )
        try:
            await asyncio.sleep(0)  # one turn of the loop: grpc sends the tier request first
            yield router_pb2.ChatEvent(
                route=router_pb2.RouteDecision(
                    request_id=request_id, tiers=[self._tier], reason="relay floor"
                )
            )
            text: list[str] = []
            usage = common_pb2.Usage()
            async for chunk in call:
                if not text:
                    yield router_pb2.ChatEvent(
                        revision_start=router_pb2.RevisionStart(revision=0, tier=self._tier)
                    )
                text.append(chunk.text)
                yield router_pb2.ChatEvent(
                    delta=router_pb2.Delta(revision=0, text=chunk.text, token_ids=chunk.token_ids)
                )
                if chunk.HasField("usage"):
                    usage = chunk.usage
            yield router_pb2.ChatEvent(
                final=router_pb2.Final(
                    revision=0,
                    tier=self._tier,
                    text="".join(text),
                    usage=[router_pb2.TierUsage(tier=self._tier, revision=0, usage=usage)],
                )
            )
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details() or "")
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close()


@dataclass
class RunningRelayFloor:
    server: grpc.aio.Server
    relay: RelayFloor
    port: int

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.relay.close()


async def start_relay_floor(tier_address: str, port: int = 0) -> RunningRelayFloor:
    """Starts the relay on 127.0.0.1:`port` (0: any free port) in this event loop."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    relay = RelayFloor(tier_address)
    router_pb2_grpc.add_RouterServiceServicer_to_server(relay, server)
    health_servicer = health.aio.HealthServicer()  # SERVING at once: what a launcher waits for
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return RunningRelayFloor(server, relay, bound)


async def serve(tier_address: str, port: int) -> None:
    running = await start_relay_floor(tier_address, port)
    print(f"gRPC relay floor on 127.0.0.1:{running.port}", flush=True)
    try:
        await running.server.wait_for_termination()
    finally:
        await running.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A bare RouterService relay (the hop's floor).")
    parser.add_argument("--tier", required=True, help="the tier's address, plaintext")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.tier, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
