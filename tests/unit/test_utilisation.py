"""RecentUtilisation: tokens per second and the KV pool's time-weighted use over a window, on a
clock the test moves."""

from __future__ import annotations

import pytest

from services.tier.startup_record import StartupRecord, process_age_s
from services.tier.utilisation import RecentUtilisation


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_tokens_per_s_counts_the_window_only() -> None:
    clock = Clock()
    recent = RecentUtilisation(window_s=5.0, clock=clock)
    recent.add_tokens(10)
    clock.now += 5.0
    recent.add_tokens(20)
    assert recent.tokens_per_s() == pytest.approx(30 / 5.0)
    clock.now += 1.0  # the first 10 fell out of the window
    assert recent.tokens_per_s() == pytest.approx(20 / 5.0)


def test_tokens_per_s_before_a_full_window_divides_by_the_time_so_far() -> None:
    clock = Clock()
    recent = RecentUtilisation(window_s=5.0, clock=clock)
    clock.now += 2.0
    recent.add_tokens(8)
    assert recent.tokens_per_s() == pytest.approx(4.0)


def test_kv_pool_use_is_weighted_by_how_long_each_level_held() -> None:
    clock = Clock()
    recent = RecentUtilisation(window_s=4.0, clock=clock)
    assert recent.kv_pool_use_share() == 0.0
    recent.sample_pool(0, 100)
    clock.now += 3.0
    recent.sample_pool(100, 100)  # full for the last second of the window
    clock.now += 1.0
    assert recent.kv_pool_use_share() == pytest.approx(0.25)
    clock.now += 4.0  # the whole window since was full
    assert recent.kv_pool_use_share() == pytest.approx(1.0)


def test_no_pool_records_nothing() -> None:
    recent = RecentUtilisation()
    recent.sample_pool(0, 0)
    assert recent.kv_pool_use_share() == 0.0


def test_startup_record_lists_imports_then_the_engine_phases() -> None:
    record = StartupRecord(imports_s=2.0, weights_loading="lazy")
    record.serving({"weights": 1.0, "kv_pool": 0.5})
    assert record.phases == [("imports", 2.0), ("weights", 1.0), ("kv_pool", 0.5)]
    assert record.total_s >= 2.0
    assert "imports 2.0 s" in record.describe()
    inside = StartupRecord()
    inside.serving({})
    assert inside.phases == []


def test_process_age_is_known_on_linux() -> None:
    age = process_age_s()
    assert age is None or age > 0
