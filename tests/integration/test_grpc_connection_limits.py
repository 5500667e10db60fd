"""Which grpc core channel arguments grpcio honours, checked with real sockets against servers
built by services.common.grpc_service.start_server (the router's, tiers' and control plane's
builder) on port 0: an unfinished HTTP/2 preface is closed at the handshake deadline, connections
past the cap are closed as accepted while established channels keep working, a ping flood gets
GOAWAY `too_many_pings`, the ping interval key SERVER_OPTIONS uses is the one grpc reads, streams
per connection are capped, and an idle connection gets GOAWAY."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.chaos.slow_connections import hold_connections
from services.common.descriptors import open_descriptors
from services.common.grpc_service import (
    KEEPALIVE_SERVER_OPTIONS,
    SERVER_OPTIONS,
    RunningServer,
    ServerLimits,
    start_server,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY = 4, 6, 7
PING_INTERVAL_KEY = next(k for k, _ in KEEPALIVE_SERVER_OPTIONS if "ping_interval" in k)
SLOW_METHOD = "/test.Slow/Wait"  # a test-only method that holds its call for a moment


def _frame(kind: int, flags: int = 0, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", 0) + payload
    )


async def _read_goaway(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int, bytes] | None:
    """The first GOAWAY's error code and debug data, or None if none came within timeout_s."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                head = await reader.readexactly(9)
                body = await reader.readexactly(int.from_bytes(head[:3], "big"))
                if head[3] == GOAWAY:
                    return int.from_bytes(body[4:8], "big"), body[8:]
    except (TimeoutError, asyncio.IncompleteReadError):
        return None


class _SlowCalls:
    """Counts the calls of SLOW_METHOD running at once (a test servicer, named as such)."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0

    async def wait(self, request: bytes, context: Any) -> bytes:
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(0.3)
        self.running -= 1
        return b"done"

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(self.wait)
        generic = grpc.method_handlers_generic_handler("test.Slow", {"Wait": handler})
        server.add_generic_rpc_handlers((generic,))


async def _server(limits: ServerLimits, calls: _SlowCalls | None = None) -> RunningServer:
    register = calls.register if calls is not None else (lambda server: None)
    running = await start_server("127.0.0.1", 0, register, [], limits=limits)
    await running.set_serving(True)
    return running


@pytest.fixture
async def capped() -> AsyncIterator[RunningServer]:
    running = await _server(ServerLimits(max_connections=20, handshake_timeout_s=1.0))
    try:
        yield running
    finally:
        await running.server.stop(0)


async def _check(channel: grpc.aio.Channel) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
    except grpc.aio.AioRpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


async def test_unfinished_prefaces_are_closed_at_the_handshake_deadline(
    capped: RunningServer,
) -> None:
    tally = await hold_connections("127.0.0.1", capped.port, "h2", 10, 3.0, reopen_s=5.0)
    # grpc's default would hold them for 120 s; here each is closed after about 1 s
    assert tally.closed_by_server == 10 and tally.open_at_end == 0, tally.to_json()
    assert all(800 <= ms <= 2500 for ms in tally.close_ms), tally.close_ms


async def test_connections_past_the_cap_are_closed_as_accepted(capped: RunningServer) -> None:
    address = f"127.0.0.1:{capped.port}"
    base = open_descriptors() or 0
    async with grpc.aio.insecure_channel(address) as kept:
        assert await _check(kept)
        attacker = asyncio.create_task(
            hold_connections("127.0.0.1", capped.port, "h2", 60, 0.8, reopen_s=5.0)
        )
        await asyncio.sleep(0.4)
        during = open_descriptors() or 0
        assert await _check(kept)  # an established channel is not affected by the cap
        tally = await attacker
        # 19 more fit beside the kept channel's connection; the other 41 were closed at once
        assert tally.refused_fast >= 60 - 20 and tally.open_at_end <= 20, tally.to_json()
        assert during - base <= 2 * 20 + 60  # our ends of 60, the server's ends of 20 at most
        await asyncio.sleep(0.3)
        async with grpc.aio.insecure_channel(address) as fresh:
            assert await _check(fresh)  # the cap frees as connections close
    assert (open_descriptors() or 0) <= base + 2


async def test_a_ping_flood_gets_goaway_too_many_pings(capped: RunningServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", capped.port)
    writer.write(PREFACE + _frame(SETTINGS) + _frame(SETTINGS, flags=1))
    reading = asyncio.create_task(_read_goaway(reader, 3.0))  # before the pipe breaks
    for n in range(10):
        if reading.done():
            break
        writer.write(_frame(PING, payload=struct.pack(">Q", n)))
        await asyncio.sleep(0.02)
    goaway = await reading
    writer.close()
    assert goaway is not None and goaway[1] == b"too_many_pings", goaway


async def test_the_ping_interval_key_of_server_options_is_the_one_grpc_reads() -> None:
    """With that key at 200 ms, pings every 400 ms are welcome; were the key ignored, grpc's
    5-minute default would answer the third one with GOAWAY."""
    options = [(k, 200 if k == PING_INTERVAL_KEY else v) for k, v in SERVER_OPTIONS]
    server = grpc.aio.server(options=options)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + _frame(SETTINGS) + _frame(SETTINGS, flags=1))
        for n in range(6):
            writer.write(_frame(PING, payload=struct.pack(">Q", n)))
            await asyncio.sleep(0.4)
        goaway = await _read_goaway(reader, 0.5)
        writer.close()
        assert goaway is None, goaway
    finally:
        await server.stop(0)


async def test_calls_per_connection_are_capped() -> None:
    calls = _SlowCalls()
    running = await _server(ServerLimits(max_streams_per_connection=4), calls)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            wait = channel.unary_unary(SLOW_METHOD)
            await wait(b"", timeout=5)
            results = await asyncio.gather(
                *(wait(b"", timeout=5) for _ in range(10)), return_exceptions=True
            )
        assert calls.peak <= 4
        # a client past the cap waits, or is refused (REFUSED_STREAM: UNAVAILABLE) as it races
        # the end of a call; never more than the cap at once
        assert sum(result == b"done" for result in results) >= 4
        for result in results:
            assert result == b"done" or result.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await running.server.stop(0)


async def test_an_idle_connection_gets_goaway() -> None:
    running = await _server(ServerLimits(idle_timeout_s=0.5))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
        writer.write(PREFACE + _frame(SETTINGS) + _frame(SETTINGS, flags=1))
        began = time.monotonic()
        goaway = await _read_goaway(reader, 3.0)
        writer.close()
        assert goaway is not None and goaway[1] == b"connection idle", goaway
        assert 0.4 <= time.monotonic() - began <= 2.5
    finally:
        await running.server.stop(0)
