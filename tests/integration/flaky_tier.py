"""A real tier (the torch engine, the real TierServicer, a gRPC server on port 0) whose first
Generate calls fail UNAVAILABLE before any response, as a tier that is restarting does; it
records each Generate attempt's `grpc-previous-rpc-attempts` (what gRPC's own retries send),
so a test tells gRPC's retries from the router's own failover.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.common.grpc_service import RunningServer, start_server
from services.tier.engine import Engine
from services.tier.factory import create_engine
from services.tier.servicer import TierServicer


class FlakyTierServicer(TierServicer):
    """The real servicer, except that its first `failures` Generate calls fail UNAVAILABLE."""

    def __init__(self, tier: str, engine: Engine, max_tokens: int, failures: int) -> None:
        super().__init__(tier, engine, max_tokens)
        self.failures = failures
        self.attempts: list[int] = []  # grpc-previous-rpc-attempts of each Generate, in order

    async def Generate(
        self, request: tier_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tier_pb2.GenerateChunk]:
        metadata = dict(context.invocation_metadata() or ())
        self.attempts.append(int(metadata.get("grpc-previous-rpc-attempts", 0)))
        if len(self.attempts) <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "tier restarting")
        async for chunk in super().Generate(request, context):
            yield chunk


@dataclass
class FlakyTier:
    servicer: FlakyTierServicer
    engine: Engine
    running: RunningServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    async def stop(self) -> None:
        await self.running.server.stop(0)
        await self.engine.shutdown()


async def start_flaky_tier(model_dir: Path, name: str, failures: int) -> FlakyTier:
    config = build_config(TierConfig, {"name": name, "model_path": str(model_dir), "port": 0})
    engine = create_engine(config)
    servicer = FlakyTierServicer(name, engine, config.max_tokens, failures)
    running = await start_server(
        config.host,
        0,
        lambda server: tier_pb2_grpc.add_TierServiceServicer_to_server(servicer, server),
        [tier_pb2.DESCRIPTOR.services_by_name["TierService"].full_name],
    )
    await engine.start()
    await running.set_serving(True)
    return FlakyTier(servicer, engine, running)
