"""The vLLM tier's scheduler counts (vllm_engine.scheduler_counts): vLLM's last report, bounded
by the requests the tier has in vLLM, since vLLM reports only after a step it takes."""

from __future__ import annotations

import pytest

from services.tier.vllm_engine import VllmStats, scheduler_counts


@pytest.mark.parametrize(
    ("running", "waiting", "in_flight", "expected"),
    [
        (0, 0, 0, (0, 0)),  # idle
        (2, 0, 2, (2, 0)),  # both running
        (1, 1, 2, (1, 1)),  # one held for KV-cache blocks
        (2, 1, 3, (2, 1)),
        (1, 0, 0, (0, 0)),  # the last request was aborted: no step reported it gone
        (2, 1, 2, (2, 0)),  # one of three already left the tier
        (1, 2, 2, (1, 1)),
        (0, 1, 0, (0, 0)),
    ],
)
def test_vllms_counts_never_exceed_the_requests_in_it(
    running: int, waiting: int, in_flight: int, expected: tuple[int, int]
) -> None:
    stats = VllmStats(running=running, waiting=waiting)
    assert scheduler_counts(stats, in_flight) == expected
