"""A tier's compute threads run below its own gRPC and event-loop threads: the torch engine's
model thread (load, batch loop) and its per-request decode threads get `compute_nice` more nice
levels than the thread that serves requests, on a real tier server with the tiny GPT-2, and
answers are unchanged. Linux only (a nice value is per thread there)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import grpc
import pytest
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.common.config import TierConfig
from services.tier.server import start_tier

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def thread_nice(thread_id: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, thread_id)


def _nice_of(prefix: str) -> set[int]:
    return {
        thread_nice(t.native_id)
        for t in threading.enumerate()
        if t.name.startswith(prefix) and t.native_id is not None
    }


@pytest.mark.parametrize("batching", [True, False])
async def test_compute_threads_run_below_the_serving_threads(
    tiny_model_dir: Path, batching: bool
) -> None:
    own = thread_nice(threading.get_native_id())
    config = TierConfig(
        name="small",
        model_path=tiny_model_dir,
        max_running=2,
        max_tokens=8,
        batching=batching,
        compute_nice=3,
    )
    server = await start_tier(config)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = tier_pb2_grpc.TierServiceStub(channel)
            request = tier_pb2.GenerateRequest(request_id="r1", prompt="Hello", max_tokens=8)
            tokens = [t async for chunk in stub.Generate(request) for t in chunk.token_ids]
        assert len(tokens) == 8
        assert _nice_of("torch-small") == {min(own + 3, 19)}
        if not batching:
            assert _nice_of("decode-small") == {min(own + 3, 19)}
        assert thread_nice(threading.get_native_id()) == own  # the serving loop is untouched
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
    finally:
        await server.stop()
