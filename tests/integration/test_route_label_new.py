"""Routing labels with the tiny real checkpoint: every phrasing of a split is labelled, with
`only_new` only the items the previous outcomes lack are run again, and the batch width changes
no label."""

from __future__ import annotations

from pathlib import Path

from services.routing.outcomes import build_outcomes
from services.workload import load_split


def test_only_new_runs_just_the_missing_items(tiny_model_dir: Path) -> None:
    runs: list[int] = []
    first = build_outcomes("dev", {"small": tiny_model_dir}, limit=3, threads=1)
    assert [o.id for o in first] == [i.id for i in load_split("dev", phrasing=None)[:3]]
    assert all(o.phrasing == "seen" and set(o.tiers) == {"small"} for o in first)

    def progress(_tier: str, _done: int, total: int) -> None:
        runs.append(total)

    again = build_outcomes(
        "dev",
        {"small": tiny_model_dir},
        limit=4,
        progress=progress,
        threads=1,
        previous=first[:2],
        only_new=True,
    )
    assert set(runs) == {2}  # items 3 and 4; the first two kept
    assert again[:2] == first[:2] and len(again) == 4


def test_the_batch_width_does_not_change_the_labels(tiny_model_dir: Path) -> None:
    one = build_outcomes("dev", {"small": tiny_model_dir}, limit=8, threads=1, concurrency=1)
    eight = build_outcomes("dev", {"small": tiny_model_dir}, limit=8, threads=1, concurrency=8)
    assert [(o.id, o.tiers["small"].correct, o.tiers["small"].tokens) for o in one] == [
        (o.id, o.tiers["small"].correct, o.tiers["small"].tokens) for o in eight
    ]
    for a, b in zip(one, eight, strict=True):
        assert abs(a.tiers["small"].confidence - b.tiers["small"].confidence) < 1e-3
