"""The decode loop's utilisation: the busy share of the last seconds (utilisation.BusyWindow),
driven with explicit times."""

from __future__ import annotations

from services.tier.utilisation import BusyWindow


def test_share_counts_only_the_window() -> None:
    busy = BusyWindow(window_s=5.0)
    assert busy.share(now=100.0) == 0.0
    busy.add(90.0, 94.0)  # wholly before the window (95, 100]
    busy.add(94.0, 96.0)  # one second inside
    busy.add(98.0, 99.5)  # 1.5 s inside
    assert busy.share(now=100.0) == (1.0 + 1.5) / 5.0


def test_share_is_capped_at_one_and_ages_out() -> None:
    busy = BusyWindow(window_s=1.0)
    busy.add(0.0, 10.0)
    assert busy.share(now=10.0) == 1.0
    assert busy.share(now=20.0) == 0.0
