"""The shared engine lifecycle, driven without a model: the finish rule, request preparation
and its limit errors, usage and TTFT bookkeeping, the recent-TTFT window, health, the load
snapshot, and that leaving early closes the decoder's stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from services.common.config import TierConfig
from services.common.errors import InvalidArgument, Overloaded, Unavailable
from services.tier.engine import GenerationChunk, GenerationRequest, Sampling
from services.tier.engine_lifecycle import EngineLifecycle, ModelFootprint, TtftWindow, UsageMeter
from services.tier.prepared_request import (
    PreparedRequest,
    PromptFormat,
    finish_reason,
    prepare_request,
)

EOS = 0


class CharTokenizer:
    """One token per character (its code point); no chat template."""

    eos_token_id = EOS
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


FORMAT = PromptFormat(CharTokenizer(), frozenset({EOS}), context_length=16)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# the finish rule


def test_end_of_sequence_token_stops() -> None:
    assert finish_reason(EOS, 1, 5, frozenset({EOS})) == "stop"
    assert finish_reason(EOS, 5, 5, frozenset({EOS})) == "stop"  # eos wins over the length


def test_max_tokens_is_length() -> None:
    assert finish_reason(7, 5, 5, frozenset({EOS})) == "length"
    assert finish_reason(7, 4, 5, frozenset({EOS})) is None


def test_a_decoder_that_ended_on_its_own_stopped() -> None:
    assert finish_reason(7, 3, 5, frozenset(), ended=True) == "stop"
    assert finish_reason(None, 0, 5, frozenset(), ended=True) == "stop"
    assert finish_reason(7, 5, 5, frozenset(), ended=True) == "length"


# preparing a request


def _request(prompt: str = "", max_tokens: int = 4, **options: object) -> GenerationRequest:
    return GenerationRequest(request_id="r", prompt=prompt, max_tokens=max_tokens, **options)  # type: ignore[arg-type]


def test_raw_prompt_and_messages_render_and_encode() -> None:
    raw = prepare_request(_request("abc"), FORMAT, max_prompt_tokens=32, tokens_per_chunk=4)
    assert raw.prompt_ids == (97, 98, 99)
    assert raw.eos_token_ids == {EOS} and raw.tokens_per_chunk == 4 and raw.max_tokens == 4
    chat = prepare_request(
        _request(messages=(("user", "hi"),), tokens_per_chunk=2, max_tokens=2),
        PromptFormat(CharTokenizer(), frozenset(), context_length=None),
        max_prompt_tokens=32,
        tokens_per_chunk=4,
    )
    assert "".join(map(chr, chat.prompt_ids)) == "user: hi\nassistant:"
    assert chat.tokens_per_chunk == 2  # the request's own chunk size wins


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="prompt: renders to zero tokens"):
        prepare_request(_request(""), FORMAT, max_prompt_tokens=32, tokens_per_chunk=4)


def test_prompt_over_the_tier_limit_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="6 tokens exceeds this tier's limit of 5 tokens"):
        prepare_request(_request("abcdef"), FORMAT, max_prompt_tokens=5, tokens_per_chunk=4)


def test_prompt_limit_is_one_less_than_the_context() -> None:
    with pytest.raises(InvalidArgument, match="16 tokens exceeds this tier's limit of 15"):
        prepare_request(_request("a" * 16), FORMAT, max_prompt_tokens=32, tokens_per_chunk=4)


def test_prompt_and_max_tokens_must_fit_the_context() -> None:
    with pytest.raises(InvalidArgument, match="prompt of 10 tokens \\+ max_tokens 7 exceeds"):
        prepare_request(_request("a" * 10, 7), FORMAT, max_prompt_tokens=32, tokens_per_chunk=4)
    unknown = PromptFormat(CharTokenizer(), frozenset(), context_length=None)
    prepared = prepare_request(
        _request("a" * 10, 700), unknown, max_prompt_tokens=32, tokens_per_chunk=4
    )
    assert prepared.max_tokens == 700  # no context known here: the decoder checks it


# usage and the TTFT window


def _chunk(n: int, finish: str | None = None) -> GenerationChunk:
    return GenerationChunk(tuple(range(1, n + 1)), "x" * n, (-0.1,) * n, finish)


def test_usage_counts_tokens_and_times_from_the_call() -> None:
    clock = FakeClock()
    received = clock.now
    clock.now += 0.010  # 10 ms in the queue
    meter = UsageMeter(prompt_tokens=9, received=received, clock=clock)
    assert meter.queue_ms == pytest.approx(10.0)
    clock.now += 0.005
    assert meter.observe(_chunk(0)).usage is None  # a chunk without tokens is no first token
    assert meter.ttft_ms is None
    clock.now += 0.005
    first = meter.observe(_chunk(1))
    assert first.usage is None and meter.ttft_ms == pytest.approx(20.0)
    clock.now += 0.030
    last = meter.observe(_chunk(3, "length"))
    assert last.usage is not None and last.finish_reason == "length"
    assert last.token_ids == (1, 2, 3)
    usage = last.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (9, 4)
    assert usage.queue_ms == pytest.approx(10.0) and usage.ttft_ms == pytest.approx(20.0)
    assert usage.total_ms == pytest.approx(50.0)


def test_usage_of_a_stream_without_tokens_has_zero_ttft() -> None:
    meter = UsageMeter(prompt_tokens=1, received=0.0, clock=FakeClock())
    usage = meter.observe(_chunk(0, "stop")).usage
    assert usage is not None and usage.ttft_ms == 0.0 and usage.completion_tokens == 0


def test_ttft_window_percentiles() -> None:
    window = TtftWindow(size=4)
    assert (window.p50, window.p99) == (0.0, 0.0)
    window.add(8.0)
    assert (window.p50, window.p99) == (8.0, 8.0)
    for value in (1.0, 2.0, 3.0, 4.0):  # pushes 8.0 out of the window
        window.add(value)
    assert len(window) == 4
    assert window.p50 == 2.5  # the median of the window
    assert window.p99 == 4.0  # nearest rank


# the lifecycle around a scripted decoder


class ScriptedEngine(EngineLifecycle):
    """Decodes a prompt into its own ids, `per_chunk` at a time; no model."""

    name = "scripted"

    def __init__(self, config: TierConfig, hold: asyncio.Event | None = None) -> None:
        super().__init__(config)
        self.hold = hold
        self.closed: list[str] = []
        self.stopped = False

    async def _start_model(self) -> PromptFormat:
        return FORMAT

    async def _decode(self, prepared: PreparedRequest) -> AsyncGenerator[GenerationChunk, None]:
        ids = list(prepared.prompt_ids)[: prepared.max_tokens]
        try:
            for start in range(0, len(ids), prepared.tokens_per_chunk):
                part = ids[start : start + prepared.tokens_per_chunk]
                end = start + len(part)
                finish = prepared.finish_after(part[-1], end, ended=end == len(ids))
                yield GenerationChunk(
                    tuple(part), "".join(map(chr, part)), (0.0,) * len(part), finish
                )
                if self.hold is not None:
                    await self.hold.wait()
        finally:
            self.closed.append(prepared.request_id)

    async def abort(self, request_id: str) -> None:
        pass

    def _footprint(self) -> ModelFootprint:
        return ModelFootprint(model="scripted", params=3, kv_pool_capacity_tokens=12)

    async def _stop_model(self) -> None:
        self.stopped = True


def _config(**options: object) -> TierConfig:
    return TierConfig(name="small", model_path=Path("scripted"), **options)  # type: ignore[arg-type]


async def test_generate_streams_with_usage_on_the_last_chunk() -> None:
    engine = ScriptedEngine(_config(tokens_per_chunk=2))
    await engine.start()
    request = GenerationRequest(request_id="a", prompt="hello", max_tokens=8)
    chunks = [chunk async for chunk in engine.generate(request)]
    assert "".join(c.text for c in chunks) == "hello"
    assert [c.finish_reason for c in chunks] == [None, None, "stop"]
    assert all(c.usage is None for c in chunks[:-1])
    usage = chunks[-1].usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (5, 5)
    assert 0.0 <= usage.queue_ms <= usage.ttft_ms <= usage.total_ms
    load = engine.load()
    assert (load.completed, load.running, load.queued) == (1, 0, 0)
    assert load.ttft_ms_p50 == load.ttft_ms_p99 == usage.ttft_ms
    assert (load.model, load.params, load.kv_pool_capacity_tokens) == ("scripted", 3, 12)
    assert load.serving and load.max_tokens == 256 and load.max_prompt_tokens == 512


async def test_length_when_max_tokens_cut_the_stream() -> None:
    engine = ScriptedEngine(_config())
    await engine.start()
    request = GenerationRequest(request_id="a", prompt="hello", max_tokens=3)
    chunks = [chunk async for chunk in engine.generate(request)]
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_not_started_or_shut_down_is_unavailable() -> None:
    engine = ScriptedEngine(_config())
    request = GenerationRequest(request_id="a", prompt="hi", max_tokens=2)
    with pytest.raises(Unavailable, match="model not loaded"):
        await engine.generate(request).__anext__()
    assert not engine.load().serving
    await engine.start()
    engine.check_health()
    await engine.shutdown()
    assert engine.stopped and not engine.load().serving
    with pytest.raises(Unavailable, match="shutting down"):
        await engine.generate(request).__anext__()


async def test_limits_are_checked_before_a_slot_is_taken() -> None:
    engine = ScriptedEngine(_config(max_prompt_tokens=3))
    await engine.start()
    with pytest.raises(InvalidArgument, match="limit of 3 tokens"):
        await engine.generate(_request("abcd")).__anext__()
    assert engine.load().rejected == 0


async def test_leaving_early_closes_the_decoder_and_frees_the_slot() -> None:
    hold = asyncio.Event()
    engine = ScriptedEngine(_config(max_running=1, max_queued=0, tokens_per_chunk=1), hold)
    await engine.start()
    stream = engine.generate(GenerationRequest(request_id="a", prompt="hello", max_tokens=5))
    async with contextlib.aclosing(stream):
        await stream.__anext__()
        assert engine.load().running == 1
        with pytest.raises(Overloaded):
            await engine.generate(_request("x")).__anext__()
    assert engine.closed == ["a"]
    load = engine.load()
    assert (load.running, load.completed, load.rejected) == (0, 0, 1)


def test_prepared_request_applies_the_rule_with_its_own_limits() -> None:
    prepared = PreparedRequest("r", (1, 2), 3, Sampling(), 4, frozenset({EOS}))
    assert prepared.finish_after(5, 2) is None
    assert prepared.finish_after(5, 3) == "length"
    assert prepared.finish_after(EOS, 1) == "stop"
