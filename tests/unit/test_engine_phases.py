"""vLLM's per-request timings as the tier's engine phases, and those as span attributes."""

from __future__ import annotations

from dataclasses import astuple, dataclass

import pytest

from services.tier.engine import EnginePhases
from services.tier.tier_telemetry import engine_phase_attributes
from services.tier.vllm_engine import engine_phases


@dataclass
class RequestStats:
    """The fields of vLLM's RequestStateStats the tier reads (engine core timestamps, s)."""

    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    num_preemptions: int = 0


@pytest.mark.parametrize(
    ("stats", "cached", "expected"),
    [
        (  # queued 20 ms in vLLM's scheduler, 50 ms prefill, 1 s of decode
            RequestStats(100.0, 100.02, 100.07, 101.07),
            0,
            EnginePhases(20.0, 50.0, 1000.0, 0, 0),
        ),
        (  # preempted twice, 128 prompt tokens in the prefix cache
            RequestStats(5.0, 5.0, 5.01, 5.51, num_preemptions=2),
            128,
            EnginePhases(0.0, 10.0, 500.0, 2, 128),
        ),
        (RequestStats(100.0, 100.02, 100.07, 100.07), None, EnginePhases(20.0, 50.0, 0.0, 0, 0)),
        (None, 0, None),  # vLLM without its stats
        (RequestStats(), 0, None),  # not yet queued
        (RequestStats(100.0, 100.02), 0, None),  # scheduled, no token yet
        (RequestStats(100.0, 99.0, 100.07, 101.0), 0, None),  # clocks out of order
    ],
)
def test_engine_phases_from_vllms_request_stats(
    stats: RequestStats | None, cached: int | None, expected: EnginePhases | None
) -> None:
    phases = engine_phases(stats, cached)
    if expected is None:
        assert phases is None
    else:
        assert phases is not None
        assert astuple(phases) == pytest.approx(astuple(expected))


def test_phases_become_the_prefill_and_decode_spans_attributes() -> None:
    attributes = engine_phase_attributes(EnginePhases(20.0, 50.1234, 1000.0, 1, 64))
    assert attributes == {
        "prefill": {
            "tiermesh.engine.scheduler_wait_ms": 20.0,
            "tiermesh.engine.prefill_ms": 50.123,
            "tiermesh.engine.cached_prompt_tokens": 64,
        },
        "decode": {"tiermesh.engine.decode_ms": 1000.0, "tiermesh.engine.preemptions": 1},
    }
    assert engine_phase_attributes(None) == {"prefill": {}, "decode": {}}
