"""Hot swap on a real tier server (port 0) serving a tiny seeded GPT-2, swapped for another seed's
checkpoint through TierAdminService.SwapModel: streams in flight at the switch finish on the old
model token for token, requests after it get the new model's answers, GetStatus and the chunks
name the new model, the old model is freed; bad paths, a swap during a swap, a failed load and
callers without the admin scope are refused, and the old model keeps serving. `tiermesh tier swap`
runs against the same kind of tier.

The old model's streams are held mid-answer by the batch scheduler's step observer (a torch
engine built with `step_observer=`, blocking the scheduler's thread before a step), so they are
certainly in flight while the swap loads, switches and serves new requests; then they are let go.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from tiermesh.v1 import tier_pb2, tier_pb2_grpc

from services.cli.main import main as tiermesh
from services.common.config import TierConfig
from services.common.config_loading import build_config
from services.security.api_keys import create_key
from services.security.settings import ServiceSecurity
from services.tier.server import TierServer, start_tier
from services.tier.step_planner import StepPlan
from services.tier.torch_engine import TorchEngine
from tests.tiny_model import build_tiny_model

PROMPTS = [
    "What is your return policy?",
    "How much does the blue kettle cost?",
    "Shipping is free on orders",
    "Hello, thank you for asking.",
]
MAX_TOKENS = 24
HOLD_AFTER_STEPS = 3  # the old model's streams are held once each has chosen this many tokens


@pytest.fixture(scope="module")
def new_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model-b"), seed=1)


def _config(model: Path, name: str = "small") -> TierConfig:
    return TierConfig(name=name, model_path=model, max_running=8, max_queued=8, max_tokens=64)


@pytest.fixture
async def tier(tiny_model_dir: Path) -> AsyncIterator[TierServer]:
    server = await start_tier(_config(tiny_model_dir))
    yield server
    await server.stop(0)


async def _answer(stub: tier_pb2_grpc.TierServiceStub, request_id: str, prompt: str) -> list[int]:
    request = tier_pb2.GenerateRequest(request_id=request_id, prompt=prompt, max_tokens=MAX_TOKENS)
    chunks = [chunk async for chunk in stub.Generate(request)]
    assert chunks[-1].finish_reason in ("stop", "length")
    return [token for chunk in chunks for token in chunk.token_ids]


async def _answers(address: str, tag: str) -> list[list[int]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        return [await _answer(stub, f"{tag}-{i}", p) for i, p in enumerate(PROMPTS)]


async def _reference(model: Path) -> list[list[int]]:
    """Each prompt's greedy answer from a tier serving `model` alone."""
    server = await start_tier(_config(model))
    try:
        return await _answers(server.address, "reference")
    finally:
        await server.stop(0)


class Hold:
    """The scheduler's step observer here: blocks the scheduler's thread once every old stream
    has chosen HOLD_AFTER_STEPS tokens, until released (or, once it watches an engine, until
    that engine begins to shut down): those streams stay in flight, mid-answer, on the old model.

    The first step also waits for `admitted` (set by the test once the tier counts every old
    stream as running): on a loaded machine the streams reach the tier one by one, and without
    the wait the first could finish its whole answer before the last arrives."""

    def __init__(self, request_ids: list[str]) -> None:
        self.steps = dict.fromkeys(request_ids, 0)
        self.admitted = threading.Event()
        self.held = threading.Event()
        self.release = threading.Event()
        self._engine: weakref.ref[TorchEngine] | None = None

    def watch(self, engine: TorchEngine) -> None:
        self._engine = weakref.ref(engine)  # no cycle to it

    def _stopping(self) -> bool:
        engine = self._engine() if self._engine is not None else None
        return engine is not None and engine._closing

    def before(self, plan: StepPlan) -> None:
        """Counts each old stream's token about to be chosen (its prefill's or a decode's)."""
        chosen = [w.request_id for w in plan.prefill] + [r.request_id for r in plan.decode]
        for request_id in chosen:
            if request_id in self.steps:
                self.admitted.wait(60)
                self.steps[request_id] += 1
                if min(self.steps.values()) >= HOLD_AFTER_STEPS and not self.release.is_set():
                    self.held.set()
                    deadline = time.monotonic() + 60
                    while not self.release.wait(0.01) and time.monotonic() < deadline:
                        if self._stopping():
                            break


@pytest.fixture
async def start_held(tiny_model_dir: Path) -> AsyncIterator[Callable[..., Awaitable[TierServer]]]:
    """Starts a tier whose torch engine's step observer is a Hold (watching that engine when
    `watch`); stops them all at the end."""
    servers: list[TierServer] = []

    async def start(hold: Hold, watch: bool = False) -> TierServer:
        config = _config(tiny_model_dir)
        engine = TorchEngine(config, step_observer=hold)
        if watch:
            hold.watch(engine)
        servers.append(await start_tier(config, engine=engine))
        return servers[-1]

    yield start
    for server in servers:
        await server.stop(0)


async def test_in_flight_streams_finish_on_the_old_model_new_ones_start_on_the_new(
    start_held: Callable[..., Awaitable[TierServer]], tiny_model_dir: Path, new_model_dir: Path
) -> None:
    hold = Hold([f"old-{i}" for i in range(len(PROMPTS))])
    tier = await start_held(hold)
    old_reference = await _answers(tier.address, "before")
    new_reference = await _reference(new_model_dir)
    assert old_reference != new_reference  # two seeds, two different models
    assert all(len(answer) > HOLD_AFTER_STEPS for answer in old_reference)

    old_engine = tier.engine
    assert isinstance(old_engine, TorchEngine) and old_engine._scheduler is not None
    assert old_engine._loaded is not None
    old_model = weakref.ref(old_engine._loaded.model)
    del old_engine
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        before = await stub.GetStatus(tier_pb2.GetStatusRequest())

        async def old_stream(i: int) -> list[tier_pb2.GenerateChunk]:
            request = tier_pb2.GenerateRequest(
                request_id=f"old-{i}", prompt=PROMPTS[i], max_tokens=MAX_TOKENS
            )
            return [chunk async for chunk in stub.Generate(request)]

        old_streams = [asyncio.create_task(old_stream(i)) for i in range(len(PROMPTS))]
        try:
            for _ in range(600):  # every old stream holds a running slot: let them step
                if (await stub.GetStatus(tier_pb2.GetStatusRequest())).running >= len(PROMPTS):
                    break
                await asyncio.sleep(0.05)
            hold.admitted.set()
            assert await asyncio.to_thread(hold.held.wait, 30), "old streams never got going"
            swap = admin.SwapModel(tier_pb2.SwapModelRequest(model_path=str(new_model_dir)))
            phases = swap.__aiter__()
            loading = (await phases.__anext__()).swap
            assert (loading.phase, loading.old_model_id) == ("loading", before.model_id)
            assert loading.model_path == str(new_model_dir.resolve())

            second = admin.SwapModel(tier_pb2.SwapModelRequest(model_path=str(tiny_model_dir)))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                [r async for r in second]
            assert raised.value.code() == grpc.StatusCode.ABORTED
            assert "in progress" in (raised.value.details() or "")

            switched = (await phases.__anext__()).swap
            assert switched.phase == "switched"
            assert switched.streams_on_old == len(PROMPTS)
            after = await stub.GetStatus(tier_pb2.GetStatusRequest())
            assert after.model_id == switched.new_model_id == f"small/{new_model_dir.name}"
            assert after.model_id != before.model_id
            assert after.running >= len(PROMPTS)  # the old model's streams still count

            new_chunks = []
            for i, prompt in enumerate(PROMPTS):
                request = tier_pb2.GenerateRequest(
                    request_id=f"new-{i}", prompt=prompt, max_tokens=MAX_TOKENS
                )
                new_chunks.append([chunk async for chunk in stub.Generate(request)])
            assert not any(stream.done() for stream in old_streams)  # still held on the old
        finally:
            hold.release.set()
        old_chunks = await asyncio.gather(*old_streams)
        done = (await phases.__anext__()).swap
        with pytest.raises(StopAsyncIteration):
            await phases.__anext__()
        status = await stub.GetStatus(tier_pb2.GetStatusRequest())

    for chunks, reference in zip(old_chunks, old_reference, strict=True):
        assert [t for c in chunks for t in c.token_ids] == reference
        assert chunks[-1].finish_reason in ("stop", "length")
        assert chunks[-1].model == before.model_id
    for chunks, reference in zip(new_chunks, new_reference, strict=True):
        assert [t for c in chunks for t in c.token_ids] == reference
        assert chunks[-1].model == after.model_id
    assert done.phase == "done"
    assert (done.streams_on_old, done.streams_cut) == (len(PROMPTS), 0)
    assert done.load_s > 0 and done.freed_bytes > 0
    assert (done.old_model_id, done.new_model_id) == (before.model_id, after.model_id)
    assert status.last_swap == done
    assert status.completed == before.completed + 2 * len(PROMPTS)
    assert status.running == 0
    assert old_model() is None, "the old model is still referenced after the swap"


async def test_a_stream_past_the_drain_timeout_ends_unavailable(
    start_held: Callable[..., Awaitable[TierServer]], new_model_dir: Path
) -> None:
    hold = Hold(["old-0"])
    hold.admitted.set()  # one stream: nothing to wait for
    tier = await start_held(hold, watch=True)
    engine = tier.engine
    assert isinstance(engine, TorchEngine) and engine._scheduler is not None
    del engine
    chunks: list[tier_pb2.GenerateChunk] = []
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        request = tier_pb2.GenerateRequest(
            request_id="old-0", prompt=PROMPTS[0], max_tokens=MAX_TOKENS
        )

        async def read() -> None:
            async for chunk in stub.Generate(request):
                chunks.append(chunk)

        reader = asyncio.create_task(read())
        try:
            assert await asyncio.to_thread(hold.held.wait, 30), "the stream never got going"
            swap = tier_pb2.SwapModelRequest(model_path=str(new_model_dir), drain_timeout_s=0.05)
            records = [response.swap async for response in admin.SwapModel(swap)]
        finally:
            hold.release.set()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await reader
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "stopped before the answer was complete" in (raised.value.details() or "")
    assert not any(chunk.finish_reason for chunk in chunks)
    assert [r.phase for r in records] == ["loading", "switched", "done"]
    assert (records[-1].streams_on_old, records[-1].streams_cut) == (1, 1)


async def test_the_swap_goes_on_when_its_caller_leaves(
    tier: TierServer, new_model_dir: Path
) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        stub = tier_pb2_grpc.TierServiceStub(channel)
        call = tier_pb2_grpc.TierAdminServiceStub(channel).SwapModel(
            tier_pb2.SwapModelRequest(model_path=str(new_model_dir))
        )
        assert (await call.read()).swap.phase == "loading"
        call.cancel()
        for _ in range(600):
            status = await stub.GetStatus(tier_pb2.GetStatusRequest())
            if status.last_swap.phase != "loading" and status.last_swap.phase != "switched":
                break
            await asyncio.sleep(0.05)
        answer = await _answer(stub, "after", PROMPTS[0])
    assert status.last_swap.phase == "done", status.last_swap
    assert status.model_id == f"small/{new_model_dir.name}"
    assert answer == (await _reference(new_model_dir))[0]


async def test_bad_paths_are_refused_by_name_and_the_model_keeps_serving(
    tier: TierServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    broken = tmp_path / "broken"  # a complete folder whose weights are not safetensors
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    bad_record = tmp_path / "bad-record"  # a complete folder whose import record is not JSON
    shutil.copytree(tiny_model_dir, bad_record)
    (bad_record / "tiermesh.json").write_text("{not json")
    before = await _answers(tier.address, "before")
    async with grpc.aio.insecure_channel(tier.address) as channel:
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        for path, code, said in (
            ("", grpc.StatusCode.INVALID_ARGUMENT, "model_path: required"),
            (str(tmp_path / "nowhere"), grpc.StatusCode.INVALID_ARGUMENT, "does not exist"),
            (str(empty), grpc.StatusCode.INVALID_ARGUMENT, "lacks config.json"),
            (str(bad_record), grpc.StatusCode.INVALID_ARGUMENT, "not valid JSON"),
            (str(broken), grpc.StatusCode.FAILED_PRECONDITION, "keeps serving"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                [r async for r in admin.SwapModel(tier_pb2.SwapModelRequest(model_path=path))]
            assert raised.value.code() == code, raised.value.details()
            assert said in (raised.value.details() or "")
            assert path in (raised.value.details() or "")
        too_long = tier_pb2.SwapModelRequest(model_path=str(broken), drain_timeout_s=-1)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            [r async for r in admin.SwapModel(too_long)]
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "drain_timeout_s" in (raised.value.details() or "")
        status = await tier_pb2_grpc.TierServiceStub(channel).GetStatus(tier_pb2.GetStatusRequest())
    assert status.model_id == f"small/{tiny_model_dir.name}"
    assert (status.last_swap.phase, status.last_swap.model_path) == ("failed", str(broken))
    assert await _answers(tier.address, "after") == before


async def test_swap_needs_the_admin_scope_when_keys_are_on(
    tmp_path: Path, tiny_model_dir: Path, new_model_dir: Path
) -> None:
    keys = tmp_path / "keys.json"
    _, chat_key = create_key(keys, "app", ("chat",))
    _, admin_key = create_key(keys, "ops", ("admin",))
    server = await start_tier(_config(tiny_model_dir), ServiceSecurity(keys_file=keys))
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            admin = tier_pb2_grpc.TierAdminServiceStub(channel)
            request = tier_pb2.SwapModelRequest(model_path=str(new_model_dir))
            for key, code in (
                (None, grpc.StatusCode.UNAUTHENTICATED),
                (chat_key, grpc.StatusCode.PERMISSION_DENIED),
            ):
                metadata = (("authorization", f"Bearer {key}"),) if key else None
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    [r async for r in admin.SwapModel(request, metadata=metadata)]
                assert raised.value.code() == code, raised.value.details()
            bearer = (("authorization", f"Bearer {admin_key}"),)
            phases = [r.swap.phase async for r in admin.SwapModel(request, metadata=bearer)]
    finally:
        await server.stop(0)
    assert phases == ["loading", "switched", "done"]


async def test_an_engine_without_hot_swap_refuses_it(tmp_path: Path) -> None:
    config = build_config(TierConfig, {"name": "small", "model_path": "unused", "engine": "echo"})
    server = await start_tier(config)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            admin = tier_pb2_grpc.TierAdminServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                request = tier_pb2.SwapModelRequest(model_path=str(tmp_path))
                [r async for r in admin.SwapModel(request)]
    finally:
        await server.stop(0)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "echo engine cannot swap" in (raised.value.details() or "")


async def test_tiermesh_tier_swap_prints_one_json_object(
    tier: TierServer, new_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tier", "swap", "small", str(new_model_dir), "--address", tier.address, "--json"]
    assert await asyncio.to_thread(tiermesh, argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["tier"] == "small"
    (replica,) = report["replicas"]
    assert replica["address"] == tier.address
    assert (replica["phase"], replica["error"]) == ("done", None)
    assert replica["new_model_id"] == f"small/{new_model_dir.name}"
    assert replica["load_s"] > 0 and replica["switch_s"] >= 0

    argv = ["tier", "swap", "small", str(new_model_dir / "nowhere"), "--address", tier.address]
    assert await asyncio.to_thread(tiermesh, argv) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and str(new_model_dir / "nowhere") in err


async def test_an_old_model_that_fails_to_stop_still_leaves_the_swap_done(
    tier: TierServer, new_model_dir: Path
) -> None:
    old = tier.engine
    real_shutdown = old.shutdown

    async def failing_shutdown() -> None:  # the fault: the old engine's shutdown raises
        raise RuntimeError("device busy")

    old.shutdown = failing_shutdown  # type: ignore[method-assign]
    try:
        await _swap_with_a_failing_shutdown(tier, new_model_dir, old)
    finally:
        await real_shutdown()  # its batch thread would keep the test process alive


async def _swap_with_a_failing_shutdown(tier: TierServer, new_model_dir: Path, old: object) -> None:
    async with grpc.aio.insecure_channel(tier.address) as channel:
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        call = admin.SwapModel(tier_pb2.SwapModelRequest(model_path=str(new_model_dir)))
        records = [response.swap async for response in call]
        assert await call.code() == grpc.StatusCode.OK
        answer = await _answer(tier_pb2_grpc.TierServiceStub(channel), "after", PROMPTS[0])
    assert [r.phase for r in records] == ["loading", "switched", "done"]
    done = records[-1]
    assert done.error.startswith(f"small/{new_model_dir.name} serves; stopping the old model")
    assert "RuntimeError: device busy" in done.error and done.freed_bytes == 0
    assert tier.engine is not old and answer == (await _reference(new_model_dir))[0]
    # the next swap is not blocked by the old engine's failure
    async with grpc.aio.insecure_channel(tier.address) as channel:
        admin = tier_pb2_grpc.TierAdminServiceStub(channel)
        again = [
            r.swap
            async for r in admin.SwapModel(tier_pb2.SwapModelRequest(model_path=str(new_model_dir)))
        ]
    assert [r.phase for r in again] == ["loading", "switched", "done"] and not again[-1].error
