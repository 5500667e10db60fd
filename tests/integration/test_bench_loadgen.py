"""The load generator against a real in-process mesh on tiny models: seeded schedules, open-loop
shedding over the in-flight cap, and the closed-loop concurrency sweep's report."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from tiermesh.client import AsyncRouterClient

from services.bench.hybrid_bench import LoadOptions, MeshTarget, run_sweep
from services.bench.loadgen import CONFIGURATIONS, SHED, LoadRun, run_open_loop
from services.bench.report import sweep_table
from services.bench.resources import ServiceHandle
from services.bench.scenarios import (
    RequestSequence,
    arrival_times,
    build_scenario,
    schedule_digest,
)
from tests.integration.mesh import start_mesh


def test_poisson_schedule_is_seeded_and_deterministic() -> None:
    scenario = build_scenario("sustained", rate_rps=50, duration_s=100, warmup_s=10, seed=3)
    first, again = arrival_times(scenario), arrival_times(scenario)
    assert first == again
    assert first != arrival_times(build_scenario("sustained", rate_rps=50, duration_s=100, seed=4))
    assert all(0 <= a < b < 100 for a, b in itertools.pairwise(first))
    assert abs(len(first) - 5000) < 4 * 5000**0.5  # Poisson: mean rate x duration, sd sqrt
    gaps = [b - a for a, b in itertools.pairwise(first)]
    assert abs(sum(gaps) / len(gaps) - 1 / 50) < 0.002  # exponential gaps of mean 1/rate


def test_burst_waves_between_near_zero_and_the_peak() -> None:
    scenario = build_scenario("burst", rate_rps=40, duration_s=200, warmup_s=0, seed=1)
    period = scenario.wave_period_s
    times = arrival_times(scenario)
    # the rate peaks mid-period and nearly stops at its ends
    near_peak = sum(1 for t in times if abs(t % period - period / 2) < period / 8)
    near_trough = sum(1 for t in times if min(t % period, period - t % period) < period / 8)
    assert near_peak > 8 * near_trough
    assert scenario.rate_at(0) == pytest.approx(40 * 0.02)
    assert scenario.rate_at(period / 2) == pytest.approx(40)


def test_request_sequence_is_seeded_and_follows_the_mix() -> None:
    mix = {"simple": 0.9, "complex": 0.1}
    sequence, again = RequestSequence(mix, seed=5), RequestSequence(mix, seed=5)
    assert again[1999].id == sequence[1999].id  # item i does not depend on the reading order
    assert [again[i].id for i in range(2000)] == [sequence[i].id for i in range(2000)]
    classes = [sequence[i].request_class for i in range(2000)]
    assert set(classes) == {"simple", "complex"}
    assert 0.87 < classes.count("simple") / 2000 < 0.93
    times = arrival_times(build_scenario("long-tail", duration_s=5, warmup_s=1, seed=5))
    assert schedule_digest(times, sequence) == schedule_digest(times, again)


@pytest.fixture
async def mesh(tiny_model_dir: Path):
    mesh = await start_mesh(tiny_model_dir, tier_options={"max_tokens": 8})
    yield mesh
    await mesh.stop()


async def test_open_loop_sheds_over_the_in_flight_cap(mesh) -> None:
    sequence = RequestSequence({"simple": 1.0}, seed=0)
    async with AsyncRouterClient(mesh.address) as client:
        run = LoadRun(client, CONFIGURATIONS["single"], max_tokens=8, timeout_s=10)
        records = await run_open_loop(run, [0.0] * 6, sequence, max_in_flight=2)
    statuses = [r.status for r in records]
    assert statuses.count("OK") == 2 and statuses.count(SHED) == 4
    assert run.counters.shed == 4 and run.counters.completed == 2
    assert all(r.tier == "large" for r in records if r.ok)


async def test_closed_loop_sweep_reports_throughput_by_concurrency(mesh) -> None:
    target = MeshTarget(
        mesh.address, [ServiceHandle(name, s.address) for name, s in mesh.tiers.items()]
    )
    scenario = build_scenario("long-tail", duration_s=1.2, warmup_s=0.2, seed=1)
    sweep = await run_sweep(
        target, scenario, [1, 3], ["single", "hybrid"], LoadOptions(max_tokens=6, timeout_s=10)
    )
    assert sweep["levels"] == [1, 3] and [row["clients"] for row in sweep["rows"]] == [1, 3]
    for row in sweep["rows"]:
        for name in ("single", "hybrid"):
            assert row[name]["requests"]["completed"] > 0
            assert row[name]["throughput_rps"] > 0
        assert isinstance(row["gain_pct"]["hybrid"], float)
    table = sweep_table(sweep)
    assert table.columns[:3] == ("clients", "single req/s", "hybrid req/s")
    assert len(table.rows) == 2
