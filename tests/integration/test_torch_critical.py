"""Critical requests in the torch engine, on a real tiny GPT-2 model. The critical lane: a
critical request is prefilled and streams its first token while the batch loop is held inside a
pass (without the lane it waits for that pass), its tokens are those it gets alone, and a
cancelled or seeded one behaves as any other request. Pausing: with every slot taken, a critical
request pauses the newest batch request, which sits out of every decode pass while it runs and
then goes on where it was, its tokens those it gets alone."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.config import TierConfig
from services.tier.decode import decode_steps
from services.tier.engine import GenerationChunk, GenerationRequest, Sampling
from services.tier.model_loading import load_causal_lm
from services.tier.step_planner import StepPlan
from services.tier.tokenizer_loading import encode_prompt
from services.tier.torch_engine import TorchEngine

HOLD_LIMIT_S = 20.0  # a held loop lets go after this, so a failing test ends


class LoopHold:
    """A step observer that, once armed, holds the batch loop at its next decode plan until
    released (the loop then runs that pass): the loop is busy, as inside a long pass. It keeps
    every decode plan's request ids."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.decoded: list[set[str]] = []

    def before(self, plan: StepPlan) -> None:
        if plan.decode:
            self.decoded.append({row.request_id for row in plan.decode})
        if plan.decode and self.armed.is_set() and not self.release.is_set():
            self.holding.set()
            self.release.wait(HOLD_LIMIT_S)
            self.holding.clear()


async def _engine(model_dir: Path, hold: LoopHold, **options: object) -> TorchEngine:
    config = TierConfig(
        name="small",
        model_path=model_dir,
        max_running=2,
        critical_reserve=0.5,
        max_tokens=400,
        **options,  # type: ignore[arg-type]
    )
    engine = TorchEngine(config, step_observer=hold)
    await engine.start()
    return engine


async def _held(hold: LoopHold) -> None:
    hold.armed.set()
    for _ in range(500):
        if hold.holding.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the batch loop never reached a decode plan")


async def _tokens(first: GenerationChunk, stream: AsyncIterator[GenerationChunk]) -> list[int]:
    tokens = list(first.token_ids)
    async for chunk in stream:
        tokens.extend(chunk.token_ids)
    return tokens


def _alone(model_dir: Path, prompt: str, max_tokens: int) -> list[int]:
    loaded = load_causal_lm(model_dir)
    steps = decode_steps(
        loaded.model,
        encode_prompt(loaded.tokenizer, prompt),
        max_new_tokens=max_tokens,
        sampling=Sampling(),
        eos_token_ids=loaded.eos_token_ids,
    )
    return [token for token, _, _ in steps]


async def test_a_critical_request_streams_while_the_loop_is_held(tiny_model_dir: Path) -> None:
    hold = LoopHold()
    engine = await _engine(tiny_model_dir, hold)
    try:
        running = engine.generate(
            GenerationRequest(request_id="long", prompt="Once upon a time", max_tokens=40)
        )
        async with contextlib.aclosing(running):
            first_running = await running.__anext__()
            await _held(hold)  # the loop is inside a decode pass of "long" now
            critical = engine.generate(
                GenerationRequest(
                    request_id="now", prompt="The answer is", max_tokens=12, priority="critical"
                )
            )
            async with contextlib.aclosing(critical):
                first = await asyncio.wait_for(critical.__anext__(), 10)
                assert hold.holding.is_set()  # streamed while the loop was still held
                hold.release.set()
                critical_tokens = await _tokens(first, critical)
            running_tokens = await _tokens(first_running, running)
        assert engine._scheduler is not None and engine._scheduler.lane_prefills == 1
    finally:
        hold.release.set()
        await engine.shutdown()
    assert critical_tokens == _alone(tiny_model_dir, "The answer is", 12)
    assert running_tokens == _alone(tiny_model_dir, "Once upon a time", 40)


async def test_without_the_lane_a_critical_request_waits_for_the_pass(
    tiny_model_dir: Path,
) -> None:
    hold = LoopHold()
    engine = await _engine(tiny_model_dir, hold, critical_lane=False)
    try:
        running = engine.generate(
            GenerationRequest(request_id="long", prompt="Once upon a time", max_tokens=40)
        )
        async with contextlib.aclosing(running):
            await running.__anext__()
            await _held(hold)
            critical = engine.generate(
                GenerationRequest(
                    request_id="later", prompt="The answer is", max_tokens=4, priority="critical"
                )
            )
            async with contextlib.aclosing(critical):
                pending = asyncio.ensure_future(critical.__anext__())
                done, _ = await asyncio.wait({pending}, timeout=1.0)
                assert not done  # held behind the pass under way
                hold.release.set()
                first = await asyncio.wait_for(pending, 10)
                assert len(await _tokens(first, critical)) == 4
        assert engine._scheduler is not None and engine._scheduler.lane_prefills == 0
    finally:
        hold.release.set()
        await engine.shutdown()


async def test_a_cancelled_critical_request_frees_its_slot(tiny_model_dir: Path) -> None:
    engine = await _engine(tiny_model_dir, LoopHold())
    try:
        stream = engine.generate(
            GenerationRequest(request_id="gone", prompt="Hi", max_tokens=400, priority="critical")
        )
        async with contextlib.aclosing(stream):
            await stream.__anext__()
        assert engine._pool is not None
        for _ in range(300):
            if engine._pool.free_slots == engine._pool.slots:
                break
            await asyncio.sleep(0.01)
        assert engine._pool.free_slots == engine._pool.slots
        assert engine.load().running == 0
    finally:
        await engine.shutdown()


@pytest.mark.parametrize("max_tokens", [1, 9])
async def test_a_seeded_critical_request_samples_as_any_other(
    tiny_model_dir: Path, max_tokens: int
) -> None:
    engine = await _engine(tiny_model_dir, LoopHold())
    sampling = Sampling(temperature=0.9, top_p=0.95, seed=7)
    try:
        results = []
        for priority in ("interactive", "critical"):
            request = GenerationRequest(
                request_id=priority,
                prompt="A seeded draw",
                max_tokens=max_tokens,
                sampling=sampling,
                priority=priority,
            )
            tokens: list[int] = []
            finish = None
            async for chunk in engine.generate(request):
                tokens.extend(chunk.token_ids)
                finish = chunk.finish_reason or finish
            results.append((tokens, finish))
        assert engine._scheduler is not None and engine._scheduler.lane_prefills == 1
    finally:
        await engine.shutdown()
    assert results[0] == results[1]
    assert len(results[1][0]) == max_tokens


async def test_a_critical_request_pauses_the_newest_batch_one_until_it_ends(
    tiny_model_dir: Path,
) -> None:
    hold = LoopHold()
    engine = await _engine(tiny_model_dir, hold)  # 2 running slots and 1 for critical requests
    prompts = {"b1": "Once upon a time", "b2": "The weather today", "c1": "The answer is"}
    prompts["c2"] = "Please tell me"
    lengths = {"b1": 400, "b2": 400, "c1": 400, "c2": 12}  # the long ones outlast the set-up
    streams = {
        name: engine.generate(
            GenerationRequest(
                request_id=name,
                prompt=prompts[name],
                max_tokens=lengths[name],
                priority="batch" if name.startswith("b") else "critical",
            )
        )
        for name in ("b1", "b2", "c1")
    }
    try:
        firsts = {name: await stream.__anext__() for name, stream in streams.items()}
        assert engine.load().running == 3  # every slot taken
        await _held(hold)
        streams["c2"] = engine.generate(
            GenerationRequest(
                request_id="c2", prompt=prompts["c2"], max_tokens=12, priority="critical"
            )
        )
        firsts["c2"] = await asyncio.wait_for(streams["c2"].__anext__(), 10)
        assert hold.holding.is_set()  # it started with every slot taken and the loop held
        assert (engine.load().running, engine.load().paused) == (3, 1)
        hold.release.set()
        tokens = {"c2": await _tokens(firsts["c2"], streams["c2"])}
        for name in ("b1", "b2", "c1"):
            tokens[name] = await _tokens(firsts[name], streams[name])
        assert engine.load().paused == 0
    finally:
        hold.release.set()
        for stream in streams.values():
            await stream.aclose()
        await engine.shutdown()
    with_c2 = [ids for ids in hold.decoded if "c2" in ids]
    assert with_c2 and all("b2" not in ids for ids in with_c2)  # b2 sat out while c2 ran
    assert all("b1" in ids for ids in with_c2 if "c1" in ids)  # b1 and c1 went on
    assert any("b2" in ids for ids in hold.decoded[hold.decoded.index(with_c2[-1]) :])
    for name, prompt in prompts.items():
        assert tokens[name] == _alone(tiny_model_dir, prompt, lengths[name]), name
