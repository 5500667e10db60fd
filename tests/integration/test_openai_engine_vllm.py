"""The openai engine in front of a real vLLM OpenAI server (`python -m
vllm.entrypoints.openai.api_server` from .venv-vllm, SmolLM2-135M-Instruct on CPU): chunks carry
the server's token ids (`return_token_ids`), and a chat the caller cancels closes its HTTP
stream, so the server's running count drops."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import httpx
import pytest
from tiermesh.client.status_details import parse_status_details
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.child_process import Child
from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.common.ports import free_port
from services.tier.server import TierServer, start_tier
from tests.integration.vllm_env import smollm2, vllm_python

pytestmark = pytest.mark.timeout(600)

LOAD_S = 300.0
STORY = "Write a long story about a dragon who learns to cook."
RUNNING = re.compile(r"^vllm:num_requests_running\{[^}]*\} ([0-9.]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM OpenAI server for the module; its API base URL."""
    python, model = vllm_python(), smollm2()
    work, port = tmp_path_factory.mktemp("vllm-server"), free_port()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "4"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}
    child = Child("vllm-server", f"127.0.0.1:{port}", command, work / "server.log", env=env)
    child.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(child, url)
        yield f"{url}/v1"
    finally:
        child.stop()


def wait_answering(child: Child, url: str) -> None:
    """Until the server lists its model; fails with its log if it exits or takes too long."""
    ends = time.monotonic() + LOAD_S
    while time.monotonic() < ends:
        if child.exited() is not None:
            raise AssertionError(f"the vLLM server exited\n{child.log_tail(30)}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the vLLM server did not answer in {LOAD_S} s\n{child.log_tail(30)}")


@pytest.fixture
async def tier(vllm_server: str) -> AsyncIterator[TierServer]:
    fields = {"name": "large", "model_path": "", "engine": "openai", "remote_url": vllm_server}
    server = await start_tier(build_config(TierConfig, fields))
    yield server
    await server.stop(0)


def request(prompt: str, max_tokens: int, request_id: str = "r") -> tier_pb2.GenerateRequest:
    return tier_pb2.GenerateRequest(
        request_id=request_id,
        messages=[common_pb2.ChatMessage(role="user", content=prompt)],
        max_tokens=max_tokens,
    )


async def test_chunks_carry_the_servers_token_ids(tier: TierServer, vllm_server: str) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        chunks = [c async for c in stub.Generate(request("What is the capital of France?", 24))]
    ids = [t for chunk in chunks for t in chunk.token_ids]
    text = "".join(chunk.text for chunk in chunks)
    assert ids and text
    assert chunks[-1].usage.completion_tokens == len(ids)
    assert chunks[-1].finish_reason in ("stop", "length")
    async with httpx.AsyncClient() as client:  # the ids are the text the server made of them
        reply = await client.post(
            vllm_server.removesuffix("/v1") + "/detokenize",
            json={"model": str(smollm2()), "tokens": [t for t in ids if t != 2]},
        )
    assert reply.json()["prompt"].strip() == text.strip()


async def server_running(api: str) -> float:
    async with httpx.AsyncClient() as client:
        metrics = (await client.get(api.removesuffix("/v1") + "/metrics")).text
    return sum(float(value) for value in RUNNING.findall(metrics))


async def test_a_cancelled_chat_drops_the_servers_running_count(
    tier: TierServer, vllm_server: str
) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        call = tier_pb2_grpc.TierServiceStub(channel).Generate(request(STORY, 256, "cancelled"))
        assert (await call.read()).token_ids
        while await server_running(vllm_server) < 1:
            await asyncio.sleep(0.1)
        call.cancel()
    while await server_running(vllm_server) > 0:  # the server saw the HTTP stream close
        await asyncio.sleep(0.1)


async def test_a_prompt_longer_than_the_servers_context_is_prompt_too_long(
    tier: TierServer,
) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            [c async for c in stub.Generate(request("Say it again: " + "word " * 2500, 8))]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = parse_status_details(refused.value.trailing_metadata())
    assert details.reason == "PROMPT_TOO_LONG"  # so a router moves the chat on to another tier
    assert details.metadata["limit_tokens"] == "2047"  # --max-model-len 2048
    assert int(details.metadata["prompt_tokens"]) > 2048


async def status_when(
    stub: tier_pb2_grpc.TierServiceStub, ready: Callable[[tier_pb2.TierStatus], bool]
) -> tier_pb2.TierStatus:
    """The tier's status once `ready` holds (it reads the server's /metrics every 2 s)."""
    for _ in range(100):
        now: tier_pb2.TierStatus = await stub.GetStatus(tier_pb2.GetStatusRequest())
        if ready(now):
            return now
        await asyncio.sleep(0.1)
    raise AssertionError(f"the tier's status never got there: {now}")


async def test_the_status_carries_the_servers_scheduler_and_prefix_cache(tier: TierServer) -> None:
    """The remote tier's TierStatus shows the server's own running requests while one streams,
    and its prefix-cache hit rate once a long prompt has been asked twice."""
    facts = " ".join(f"Note {n}: drawer {n} holds {n * 3} blue pens." for n in range(24))
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        call = stub.Generate(request(STORY, 256, "long"))
        await call.read()
        busy = await status_when(stub, lambda s: s.engine_running >= 1)
        assert busy.engine_waiting == 0
        call.cancel()
        for n in range(2):
            assert [c async for c in stub.Generate(request(facts, 2, f"facts-{n}"))]
        cached = await status_when(stub, lambda s: s.prefix_cache_hit_rate > 0)
        assert cached.prefix_cache_hit_rate <= 1.0
        await status_when(stub, lambda s: s.engine_running == 0)  # the server is done with both
