"""The gateway (uvicorn, port 0, in this process) against slow and half-open connections: real
sockets from services.chaos.slow_connections, a few hundred at a time with the caps set low.
Normal requests are still answered, the excess is refused fast (503 with Retry-After), the
deadlines close what never finishes, and every descriptor is released afterwards."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from services.chaos.slow_connections import attack, hold_connections
from services.common.config import GatewayConfig
from services.common.config_loading import build_config
from services.common.descriptors import open_descriptors
from services.gateway.connection_guard import (
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    HEADERS_TOO_LARGE,
    IDLE_TIMEOUT,
    MIN_IDLE_S,
    REFUSED_CLIENT,
)
from services.gateway.server import RunningGateway, start_gateway
from tests.integration.processes import free_port

CAP = 64
PER_CLIENT = 40


async def _gateway(**options: Any) -> RunningGateway:
    router = f"127.0.0.1:{free_port()}"  # nobody: /v1/models and /metrics need no router
    config = build_config(GatewayConfig, {"port": 0, "router": router, **options})
    return await start_gateway(config)


@pytest.fixture
async def gateway() -> AsyncIterator[RunningGateway]:
    running = await _gateway(
        max_connections=CAP,
        max_connections_per_client=PER_CLIENT,
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        keepalive_timeout_s=0.5,
    )
    try:
        yield running
    finally:
        await running.stop()


async def _raw(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def _closed_after(
    reader: asyncio.StreamReader, timeout_s: float = 5.0
) -> tuple[float, bytes]:
    """Seconds until the server closed the connection, and what it sent before."""
    began = time.monotonic()
    received = b""
    async with asyncio.timeout(timeout_s):
        while chunk := await reader.read(65536):
            received += chunk
    return time.monotonic() - began, received


async def _released(running: RunningGateway, base: int, timeout_s: float = 5.0) -> int | None:
    """This process's descriptors once back to `base` (+2), or as they are after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = open_descriptors()
        if count is None or count <= base + 2 or time.monotonic() > deadline:
            return count
        await asyncio.sleep(0.05)


async def _fresh_request(url: str) -> str:
    """GET over a new connection: "200", "503 retry after N" or "closed"; fast either way."""
    began = time.monotonic()
    try:
        async with httpx.AsyncClient() as new:
            response = await new.get(url, timeout=5)
    except httpx.TransportError:
        outcome = "closed"
    else:
        retry = response.headers.get("retry-after")
        outcome = f"{response.status_code}" + (f" retry after {retry}" if retry else "")
    assert time.monotonic() - began < 1.5, outcome
    return outcome


async def test_half_open_connections_are_capped_and_normal_requests_still_answered() -> None:
    gateway = await _gateway(
        max_connections=CAP, max_connections_per_client=PER_CLIENT, header_timeout_s=1.0
    )
    try:
        await _half_open_attack(gateway)
    finally:
        await gateway.stop()


async def _half_open_attack(gateway: RunningGateway) -> None:
    url = f"{gateway.url}/v1/models"
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as kept:
        assert (await kept.get(url)).status_code == 200
        base = open_descriptors() or 0
        attackers = [
            asyncio.create_task(
                # opened once each: a refused or closed one does not come back within the hold
                hold_connections(
                    "127.0.0.1", gateway.port, "http", 150, 5.0, reopen_s=10.0, source=a
                )
            )
            for a in ("127.0.0.2", "127.0.0.3")
        ]
        most_open, kept_statuses, fresh = 0, [], []
        # the attack's connections are open (the gateway at its cap: on a busy machine the
        # burst takes a while to be accepted) and idle
        deadline = time.monotonic() + 4.0
        while gateway.connections.open < CAP and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(2 * MIN_IDLE_S)
        while not all(task.done() for task in attackers):
            most_open = max(most_open, gateway.connections.open)
            kept_statuses.append((await kept.get(url, timeout=5)).status_code)
            fresh.append(await _fresh_request(url))
            await asyncio.sleep(0.2)
        tallies = [await task for task in attackers]
        assert set(kept_statuses) == {200}, kept_statuses
        # a new connection gets in by making room: the attack's are idle and never sent a request
        assert fresh and set(fresh) == {"200"}, fresh
        assert most_open <= CAP
        for tally in tallies:
            # refused as accepted: 503 where the partial request was already there, else closed
            assert tally.refused_fast > 0 and tally.peak_open <= 150
        assert sum(t.answers["503"] for t in tallies) == gateway.connections.answered_503
        assert gateway.connections.refused[REFUSED_CLIENT] > 0
        released = await _released(gateway, base)
        assert released is not None and released <= base + 2, (released, base)
        assert gateway.connections.open == 1  # the kept-alive client's
        assert (await kept.get(url)).status_code == 200


async def test_attack_from_worker_processes_is_refused_per_client_address(
    gateway: RunningGateway,
) -> None:
    tally = await attack("127.0.0.1", gateway.port, "http", 120, 2.0, processes=2, reopen_s=0.5)
    assert tally.asked == 120 and not tally.connect_failed, tally.to_json()
    # two addresses of 60 each against 40 per client: 20 of each refused, then again on reopen
    assert tally.refused_fast >= 40
    assert CAP / 2 <= tally.open_at_end <= CAP + 4  # + those being closed to make room
    assert gateway.connections.open <= CAP
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{gateway.url}/v1/models")).status_code == 200


@pytest.mark.parametrize("trickle", [False, True])
async def test_headers_not_finished_in_time_are_closed(
    gateway: RunningGateway, trickle: bool
) -> None:
    reader, writer = await _raw(gateway.port, b"GET /v1/models HTTP/1.1\r\n")
    if trickle:  # a byte every 0.2 s does not move the deadline
        for _ in range(3):
            await asyncio.sleep(0.2)
            writer.write(b"X")
    seconds, received = await _closed_after(reader)
    writer.close()
    assert 0.8 <= seconds + (0.6 if trickle else 0) <= 3.0 and received == b""
    assert gateway.connections.closed[HEADER_TIMEOUT] == 1


async def test_a_silent_connection_is_closed_at_the_header_deadline(
    gateway: RunningGateway,
) -> None:
    reader, writer = await _raw(gateway.port, b"")
    seconds, received = await _closed_after(reader)
    writer.close()
    assert 0.8 <= seconds <= 3.0 and received == b""


async def test_a_body_not_finished_in_time_is_answered_408(gateway: RunningGateway) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model":'
    )
    reader, writer = await _raw(gateway.port, head)
    seconds, received = await _closed_after(reader)
    writer.close()
    assert 0.8 <= seconds <= 3.0
    assert received.startswith(b"HTTP/1.1 408 ") and b"body_timeout" in received
    assert gateway.connections.closed[BODY_TIMEOUT] == 1


async def test_idle_kept_alive_connections_are_closed(gateway: RunningGateway) -> None:
    reader, writer = await _raw(gateway.port, b"GET /v1/models HTTP/1.1\r\nHost: g\r\n\r\n")
    seconds, received = await _closed_after(reader)
    writer.close()
    assert received.startswith(b"HTTP/1.1 200 ")
    assert 0.4 <= seconds <= 2.5
    assert gateway.connections.closed[IDLE_TIMEOUT] == 1


async def test_oversized_headers_are_answered_431(gateway: RunningGateway) -> None:
    huge = b"GET /v1/models HTTP/1.1\r\nHost: g\r\n" + b"X-Pad: " + b"a" * 70_000
    reader, writer = await _raw(gateway.port, huge)
    _, received = await _closed_after(reader)
    writer.close()
    assert received.startswith(b"HTTP/1.1 431 ")
    assert gateway.connections.closed[HEADERS_TOO_LARGE] == 1


async def test_metrics_show_descriptors_and_refusals(gateway: RunningGateway) -> None:
    socks = []
    for _ in range(PER_CLIENT + 5):  # five past the per-client cap, refused as accepted
        sock = socket.create_connection(("127.0.0.1", gateway.port))
        socks.append(sock)
    await asyncio.sleep(0.3)
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.9")  # not the full address
    async with httpx.AsyncClient(transport=transport) as client:
        text = (await client.get(f"{gateway.url}/metrics")).text
    for sock in socks:
        sock.close()
    lines = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert (
        lines['tiermesh_gateway_connections_refused_total{reason="max_connections_per_client"}']
        >= 5
    )
    assert lines['tiermesh_gateway_connection_limit{scope="all"}'] == CAP
    assert lines["tiermesh_gateway_open_connections"] >= PER_CLIENT
    assert lines["process_open_fds"] > PER_CLIENT
    assert lines["process_max_fds"] > CAP
