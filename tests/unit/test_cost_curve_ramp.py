"""The cost curve's closed loop spreads its clients' first chats over the ramp instead of starting
them as one burst, and the ramp's default follows an echo chat's length."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from services.bench.cost_curve import CostOptions, Sample, closed_loop
from services.bench.cost_curve_cli import CostCurveError, ramp_seconds
from services.launcher.echo_tiers import EchoSettings


async def test_first_chats_are_spread_evenly_over_the_ramp() -> None:
    starts: dict[int, float] = {}

    async def chat(index: int, sample: Sample) -> None:  # a chat that outlasts the run
        starts[index] = sample.started_s
        await asyncio.sleep(10)

    options = CostOptions(levels=[5], duration_s=0.8, warmup_s=0.5, ramp_s=0.5)
    samples, _ = await closed_loop(chat, 5, options, watched=[])
    firsts = sorted(s.started_s for s in samples)
    assert len(firsts) == 5  # one chat each: none ended inside the run
    for number, started in enumerate(firsts):
        assert started >= number * 0.1  # client i waits i/5 of the 0.5 s ramp
    assert firsts[-1] < 0.8


async def test_no_ramp_starts_every_client_at_once() -> None:
    async def chat(index: int, sample: Sample) -> None:
        await asyncio.sleep(10)

    options = CostOptions(levels=[4], duration_s=0.3, warmup_s=0.2, ramp_s=0.0)
    samples, _ = await closed_loop(chat, 4, options, watched=[])
    assert len(samples) == 4 and max(s.started_s for s in samples) < 0.1


def _args(ramp: float | None, max_tokens: int = 32) -> argparse.Namespace:
    return argparse.Namespace(ramp=ramp, max_tokens=max_tokens)


def test_the_default_ramp_is_one_echo_chat_or_the_warmup() -> None:
    echo = EchoSettings(ttft_ms=10.0, tokens_per_s=5.0)
    assert ramp_seconds(_args(None), 8.0, echo) == pytest.approx(0.01 + 31 / 5)
    assert ramp_seconds(_args(None), 4.0, echo) == 4.0  # never past the warm-up
    assert ramp_seconds(_args(None), 8.0, None) == 8.0  # models: answers of many lengths
    unpaced = EchoSettings(ttft_ms=10.0, tokens_per_s=0.0)
    assert ramp_seconds(_args(None), 8.0, unpaced) == 8.0
    assert ramp_seconds(_args(2.5), 8.0, echo) == 2.5


def test_a_ramp_outside_the_warmup_is_refused() -> None:
    with pytest.raises(CostCurveError, match=r"--ramp must be in \[0, --warmup = 8\], got 9"):
        ramp_seconds(_args(9.0), 8.0, None)
    with pytest.raises(CostCurveError, match="got -1"):
        ramp_seconds(_args(-1.0), 8.0, None)
