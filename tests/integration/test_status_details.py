"""google.rpc details on error statuses, end to end over real gRPC: what the server attaches
with services.common.status_details arrives in the client's ChatError (sync and async) and in
`tiermesh chat --json`'s error event. The server is a minimal RouterService servicer (named as
such) that only aborts: what is tested is the status encoding, not the router."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import pytest
from tiermesh.client import AsyncRouterClient, ChatError, RouterClient
from tiermesh.v1 import router_pb2_grpc

from services.common.status_details import abort_with_details


class AbortingRouterServicer(router_pb2_grpc.RouterServiceServicer):
    """Chat fails as the prompt asks: "overload" or "bad field"."""

    async def Chat(self, request, context):
        if request.prompt == "deadline?":  # says how long the client gave it
            remaining = context.time_remaining()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{remaining}")
        if request.prompt == "overload":
            await abort_with_details(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "router at capacity",
                reason="ROUTER_AT_CAPACITY",
                retry_after_s=1.25,
            )
        await abort_with_details(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens: must be in [1, 200], got 0",
            reason="INVALID_FIELD",
            field="max_tokens",
        )
        yield  # an async generator, as the real servicer


@pytest.fixture
async def address() -> AsyncIterator[str]:
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServiceServicer_to_server(AbortingRouterServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def test_async_client_reads_retry_info_and_reason(address: str) -> None:
    async with AsyncRouterClient(address) as client:
        with pytest.raises(ChatError) as raised:
            await client.chat("overload")
    error = raised.value
    assert (error.code, error.message) == ("RESOURCE_EXHAUSTED", "router at capacity")
    assert error.retry_after_s == pytest.approx(1.25)
    assert (error.details.reason, error.details.domain) == ("ROUTER_AT_CAPACITY", "tiermesh")


async def test_sync_client_reads_the_bad_field(address: str) -> None:
    def call() -> ChatError:
        with RouterClient(address) as client, pytest.raises(ChatError) as raised:
            client.chat("bad")
        return raised.value

    import asyncio

    error = await asyncio.to_thread(call)
    assert error.code == "INVALID_ARGUMENT"
    assert error.details.field_violations == (
        ("max_tokens", "max_tokens: must be in [1, 200], got 0"),
    )
    assert error.retry_after_s is None


async def test_chat_json_error_event_carries_the_details(address: str) -> None:
    import asyncio

    command = [sys.executable, "-m", "services.cli", "chat", "--router", address, "--json"]
    done = await asyncio.to_thread(
        subprocess.run, [*command, "overload"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    event = json.loads(done.stdout.splitlines()[-1])
    assert event["type"] == "error" and event["code"] == "RESOURCE_EXHAUSTED"
    assert event["retry_after_s"] == pytest.approx(1.25)
    assert event["reason"] == "ROUTER_AT_CAPACITY"
    assert event["field_violations"] == []


async def test_the_sdk_gives_every_chat_a_deadline_by_default(address: str) -> None:
    async with AsyncRouterClient(address) as client:
        with pytest.raises(ChatError) as default:
            await client.chat("deadline?")
        with pytest.raises(ChatError) as shorter:
            await client.chat("deadline?", timeout=5)
    # the grpc-timeout header rounds the deadline up a little on the wire
    assert 100 < float(default.value.message) <= 121  # DEFAULT_TIMEOUT_S
    assert 0 < float(shorter.value.message) <= 5.5
