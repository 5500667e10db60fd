"""A tier on vLLM (`engine = "vllm"`): one real tier process running vLLM's async engine on
SmolLM2-135M-Instruct (CPU, bfloat16), called over gRPC. Its greedy answer is the torch
engine's; chunks carry token ids and log-probabilities; stop sequences, seeds, cancellation,
continuation and bad input behave as on every tier; its status carries vLLM's own scheduler
counts and prefix-cache hit rate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tiermesh.v1 import common_pb2, tier_pb2, tier_pb2_grpc

from services.common.child_process import Child
from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.common.ports import free_port
from services.tier.server import start_tier
from tests.integration.processes import wait_serving, write_toml
from tests.integration.vllm_env import smollm2, vllm_python

pytestmark = pytest.mark.timeout(600)

PROMPT = "What is the capital of France?"
STORY = "Write a long story about a dragon who learns to cook."  # an answer of many tokens
MAX_TOKENS = 24
# a prompt over two of vLLM's 128-token CPU cache blocks, so a second ask finds them cached
FACTS = " ".join(f"Fact {n}: shelf {n} holds {n * 7} red boxes." for n in range(24))
LOAD_S = 300.0


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return smollm2()


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the module's vLLM tier writes its spans (TIERMESH_TRACE_FILE)."""
    return tmp_path_factory.mktemp("vllm-spans") / "spans.jsonl"


@pytest.fixture(scope="module")
def vllm_tier(
    tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, spans_file: Path
) -> Iterator[str]:
    """One vLLM tier process for the module: two running, one waiting; spans to `spans_file`."""
    python = vllm_python()
    work = tmp_path_factory.mktemp("vllm-tier")
    port = free_port()
    config = write_toml(
        work / "large.toml",
        {
            "name": "large",
            "engine": "vllm",
            "model_path": str(smollm2_dir),
            "dtype": "bfloat16",
            "port": port,
            "max_running": 2,
            "max_queued": 1,
            "max_tokens": 256,
            "max_prompt_tokens": 512,
            "max_model_len": 2048,
            "torch_threads": 2,
            "cpu_kvcache_space_gib": 1,
        },
        {},
    )
    command = [str(python), "-m", "services.tier.vllm_server", "--config", str(config)]
    env = {"TIERMESH_TRACE_FILE": str(spans_file)}
    child = Child("vllm-large", f"127.0.0.1:{port}", command, work / "tier.log", env=env)
    child.start()
    try:
        asyncio.run(wait_serving(child, LOAD_S))
        yield child.address
    finally:
        child.stop()


def request(**fields: Any) -> tier_pb2.GenerateRequest:
    sampling = fields.pop("sampling", {})
    return tier_pb2.GenerateRequest(
        request_id=fields.pop("request_id", "r"),
        messages=[common_pb2.ChatMessage(role="user", content=fields.pop("prompt", PROMPT))],
        max_tokens=fields.pop("max_tokens", MAX_TOKENS),
        tokens_per_chunk=1,
        sampling=common_pb2.SamplingParams(**sampling),
        **fields,
    )


async def generate(address: str, **fields: Any) -> list[tier_pb2.GenerateChunk]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return [chunk async for chunk in stub.Generate(request(**fields))]


def ids_of(chunks: list[tier_pb2.GenerateChunk]) -> list[int]:
    return [t for chunk in chunks for t in chunk.token_ids]


def text_of(chunks: list[tier_pb2.GenerateChunk]) -> str:
    return "".join(chunk.text for chunk in chunks)


async def test_the_greedy_answer_is_the_torch_engines(vllm_tier: str, smollm2_dir: Path) -> None:
    on_vllm = await generate(vllm_tier)
    fields = {"name": "large", "model_path": str(smollm2_dir), "dtype": "bfloat16"}
    torch_tier = await start_tier(build_config(TierConfig, fields))
    try:
        on_torch = await generate(torch_tier.address)
    finally:
        await torch_tier.stop(0)
    assert text_of(on_vllm) == text_of(on_torch)
    assert ids_of(on_vllm) == ids_of(on_torch)
    assert on_vllm[-1].usage.completion_tokens == len(ids_of(on_vllm))
    assert on_vllm[-1].usage.prompt_tokens == on_torch[-1].usage.prompt_tokens
    assert on_vllm[-1].model_fingerprint == on_torch[-1].model_fingerprint


async def test_chunks_carry_token_ids_and_log_probabilities(vllm_tier: str) -> None:
    chunks = await generate(vllm_tier, sampling={"top_logprobs": 3})
    entries = [e for chunk in chunks for e in chunk.token_logprobs]
    ids = ids_of(chunks)
    assert len(ids) == len(entries) > 1
    assert "".join(e.text for e in entries) == text_of(chunks)
    for token, entry, logprob in zip(
        ids, entries, [lp for c in chunks for lp in c.logprobs], strict=True
    ):
        assert len(entry.top) == 3
        assert entry.top[0].token_id == token  # greedy: the likeliest token is the one chosen
        assert entry.top[0].logprob == pytest.approx(logprob, abs=1e-4)
        assert entry.logprob == pytest.approx(logprob, abs=1e-4)
        assert [t.logprob for t in entry.top] == sorted(
            (t.logprob for t in entry.top), reverse=True
        )
        assert logprob <= 0.0


async def test_a_stop_sequence_ends_the_answer_before_it(vllm_tier: str) -> None:
    whole = text_of(await generate(vllm_tier))
    stop = whole.split()[2]
    chunks = await generate(vllm_tier, sampling={"stop": [stop]})
    assert text_of(chunks) == whole[: whole.index(stop)]
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].stop_sequence == stop


async def test_a_seed_gives_the_same_sampled_answer(vllm_tier: str) -> None:
    sampling = {"temperature": 1.0, "seed": 7}
    first = await generate(vllm_tier, sampling=sampling, request_id="a")
    second = await generate(vllm_tier, sampling=sampling, request_id="b")
    assert ids_of(first) == ids_of(second)
    assert text_of(first) == text_of(second)


async def status(address: str) -> tier_pb2.TierStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return await stub.GetStatus(tier_pb2.GetStatusRequest())


async def running(address: str) -> int:
    return int((await status(address)).running)


async def test_the_status_reports_vllms_engine_and_kv_cache(vllm_tier: str) -> None:
    await generate(vllm_tier, max_tokens=8)
    now = await status(vllm_tier)
    assert (now.engine, now.serving, now.max_running, now.max_queued) == ("vllm", True, 2, 1)
    assert now.kv_pool_capacity_tokens > 0
    assert 0 < now.kv_pool_peak_tokens <= now.kv_pool_capacity_tokens
    assert now.params > 100_000_000 and now.weights_bytes > 0
    assert (now.engine_running, now.engine_waiting) == (0, 0)  # the answer is done


async def watched(address: str) -> tier_pb2.TierStatus:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        call = stub.WatchLoad(tier_pb2.WatchLoadRequest(interval_ms=50))
        first: tier_pb2.TierStatus = await call.read()
        call.cancel()
        return first


async def busy_streams(stub: tier_pb2_grpc.TierServiceStub, tag: str) -> list[Any]:
    """Two long answers (the tier's two running slots), each past its first chunk."""
    calls = [
        stub.Generate(request(prompt=STORY, max_tokens=256, request_id=f"{tag}{n}"))
        for n in range(2)
    ]
    for call in calls:
        await call.read()
    return calls


async def test_the_status_carries_vllms_scheduler_and_prefix_cache(vllm_tier: str) -> None:
    await generate(vllm_tier, prompt=FACTS, max_tokens=2, request_id="facts-1")
    before = await status(vllm_tier)
    await generate(vllm_tier, prompt=FACTS, max_tokens=2, request_id="facts-2")
    after = await status(vllm_tier)
    assert 0.0 <= before.prefix_cache_hit_rate < after.prefix_cache_hit_rate <= 1.0
    assert (await watched(vllm_tier)).prefix_cache_hit_rate == after.prefix_cache_hit_rate
    async with grpc.aio.insecure_channel(vllm_tier) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        calls = await busy_streams(stub, "busy")
        while (now := await watched(vllm_tier)).engine_running < 2:  # vLLM's next step
            await asyncio.sleep(0.05)
        assert (now.engine_running, now.engine_waiting, now.running) == (2, 0, 2)
        assert now.kv_pool_used_tokens > 0
        for call in calls:
            call.cancel()
    while (await status(vllm_tier)).engine_running:  # both aborted: none left in vLLM
        await asyncio.sleep(0.05)


async def spans_of(spans_file: Path, request_ids: set[str]) -> list[dict[str, Any]]:
    """The spans of the requests' traces once their server spans are in the file (the tier
    writes spans in batches every 200 ms)."""
    for _ in range(100):
        if spans_file.exists():
            spans = [json.loads(line) for line in spans_file.read_text().splitlines()]
            served = {s["attributes"].get("tiermesh.request_id") for s in spans}
            if request_ids <= served:
                return spans
        await asyncio.sleep(0.1)
    raise AssertionError(f"no server spans of {sorted(request_ids)} in {spans_file}")


async def test_the_engine_spans_carry_vllms_own_phases(vllm_tier: str, spans_file: Path) -> None:
    """The tier's engine prefill and decode spans carry what vLLM measured of the request: its
    scheduler wait, prefill, decode, preemptions, and the prompt tokens its prefix cache held (a
    second ask of one long prompt finds its blocks cached)."""
    notes = " ".join(f"Note {n}: drawer {n} holds {n * 3} blue pens." for n in range(24))
    prompt = f"{notes} Write a long story about these drawers."  # more than 8 tokens to say
    for n in (1, 2):
        await generate(vllm_tier, prompt=prompt, max_tokens=8, request_id=f"spans-{n}")
    spans = await spans_of(spans_file, {"spans-1", "spans-2"})
    phases: dict[str, dict[str, Any]] = {}
    for server in spans:
        rid = server["attributes"].get("tiermesh.request_id")
        if rid in ("spans-1", "spans-2"):
            for span in spans:
                if span["parent_id"] == server["span_id"]:
                    phases.setdefault(rid, {})[span["name"]] = span["attributes"]
    for rid in ("spans-1", "spans-2"):
        prefill, decode = phases[rid]["engine prefill"], phases[rid]["engine decode"]
        assert prefill["tiermesh.engine.scheduler_wait_ms"] >= 0
        assert prefill["tiermesh.engine.prefill_ms"] > 0
        assert decode["tiermesh.engine.decode_ms"] > 0  # 8 tokens: 7 decode steps
        assert decode["tiermesh.engine.preemptions"] == 0
        assert decode["gen_ai.usage.output_tokens"] == 8
    cached = [
        phases[rid]["engine prefill"]["tiermesh.engine.cached_prompt_tokens"]
        for rid in ("spans-1", "spans-2")
    ]
    assert cached[0] < cached[1] and cached[1] >= 128  # at least one 128-token block


async def test_a_cancelled_stream_frees_its_slot(vllm_tier: str) -> None:
    async with grpc.aio.insecure_channel(vllm_tier) as channel:
        call = tier_pb2_grpc.TierServiceStub(channel).Generate(
            request(prompt=STORY, max_tokens=256, request_id="cancelled")
        )
        first = await call.read()
        assert first.token_ids
        assert await running(vllm_tier) == 1
        call.cancel()
    while await running(vllm_tier):  # the slot is freed once vLLM has aborted the request
        await asyncio.sleep(0.1)
    assert ids_of(await generate(vllm_tier, max_tokens=4))  # and the tier goes on serving


async def test_full_means_resource_exhausted_with_a_retry_delay(vllm_tier: str) -> None:
    async with grpc.aio.insecure_channel(vllm_tier) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        calls = await busy_streams(stub, "f")  # both running (max_num_seqs 2)
        waiting = stub.Generate(request(max_tokens=4, request_id="waits"))
        while await running(vllm_tier) < 2:
            await asyncio.sleep(0.1)
        refused = stub.Generate(request(max_tokens=4, request_id="refused"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await refused.read()
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        keys = [key for key, _ in raised.value.trailing_metadata() or ()]
        assert "grpc-status-details-bin" in keys
        for call in calls:
            call.cancel()
        assert [c async for c in waiting][-1].finish_reason


async def test_a_continuation_equals_the_unbroken_answer(vllm_tier: str) -> None:
    whole = await generate(vllm_tier)
    ids = ids_of(whole)
    k = len(ids) // 2
    had = text_of(whole[:k])
    rest = await generate(vllm_tier, continue_token_ids=ids[:k], continue_text_chars=len(had))
    assert ids_of(rest) == ids[k:]
    assert had + text_of(rest) == text_of(whole)
    assert rest[-1].usage.prompt_tokens == whole[-1].usage.prompt_tokens + k


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt": "word " * 600}, "prompt"),
        ({"continue_token_ids": [10**6]}, "continue_token_ids[0]"),
        ({"max_tokens": 5000}, "max_tokens"),
    ],
)
async def test_bad_input_is_invalid_argument(
    vllm_tier: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(vllm_tier, **fields)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (raised.value.details() or "")


def linked_copy(folder: Path, to: Path) -> Path:
    """The model folder under another name (its files linked): a second checkpoint to swap to."""
    to.mkdir()
    for file in folder.iterdir():
        (to / file.name).symlink_to(file.resolve())
    return to


async def test_a_hot_swap_drops_no_stream(
    vllm_tier: str, smollm2_dir: Path, tmp_path: Path
) -> None:
    """The tier loads a second vLLM engine while a chain of streams keeps it busy, each stream
    opened when the one before is halfway (so one is always in flight, at most two run); every
    stream ends complete, those started before the switch on the old model and after it on the
    new, and the old engine is stopped. (Last in the module: the new engine serves after it.)"""
    new_dir = linked_copy(smollm2_dir, tmp_path / "smollm2-swapped")
    finished: list[tier_pb2.GenerateChunk] = []
    swapping = True
    length = 96

    async def chain(stub: tier_pb2_grpc.TierServiceStub, n: int = 0) -> None:
        fields = {"prompt": STORY, "max_tokens": length, "request_id": f"swap-{n}"}
        chunks: list[tier_pb2.GenerateChunk] = []
        following: asyncio.Task[None] | None = None
        async for chunk in stub.Generate(request(**fields)):
            chunks.append(chunk)
            if len(chunks) == length // 2 and swapping:
                following = asyncio.create_task(chain(stub, n + 1))
        assert chunks[-1].finish_reason == "length", chunks[-1]  # (else the chain has a gap)
        finished.append(chunks[-1])
        if following is not None:
            await following

    async with grpc.aio.insecure_channel(vllm_tier) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        before = await stub.GetStatus(tier_pb2.GetStatusRequest())
        reference = ids_of([chunk async for chunk in stub.Generate(request())])
        streams = asyncio.create_task(chain(stub))
        try:
            swap = admin.SwapModel(tier_pb2.SwapModelRequest(model_path=str(new_dir)))
            phases = [response.swap async for response in swap]
        finally:
            swapping = False
            await streams  # a failed stream fails the test here
        after = await stub.GetStatus(tier_pb2.GetStatusRequest())
        answer = [chunk async for chunk in stub.Generate(request())]

    assert [p.phase for p in phases] == ["loading", "switched", "done"]
    done = phases[-1]
    assert done.streams_cut == 0 and done.streams_on_old >= 1  # the chain had one
    assert (done.old_model_id, done.new_model_id) == (before.model_id, after.model_id)
    assert after.model_id == "large/smollm2-swapped" and after.last_swap == done
    assert {c.model for c in finished} == {before.model_id, after.model_id}
    assert answer[-1].model == after.model_id
    assert ids_of(answer) == reference  # the same weights, greedy
