"""The committed train/dev/test splits: how each is generated, written as JSONL and loaded.

test is drawn first, dev avoids test's medium/complex prompts, train avoids both; the trainer's
endless stream avoids dev and test too. dev and test end with held-out phrasings (phrasings.py),
written after their seen items, which stay as they were. Knows nothing of tokenizers or models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.workload.generator import Phrasing, RequestClass, WorkloadItem, generate
from services.workload.phrasings import generate_unseen

DATA_DIR = Path(__file__).parent / "data"
TRAFFIC_MIX: Mapping[str, float] = {"simple": 0.90, "medium": 0.06, "complex": 0.04}
TRAIN_MIX: Mapping[str, float] = {"simple": 0.30, "medium": 0.30, "complex": 0.40}


@dataclass(frozen=True)
class SplitSpec:
    """How one split is generated: its seed, size and class mix."""

    name: str
    seed: int
    n: int
    mix: Mapping[str, float]
    unique: bool = True  # no medium/complex prompt twice within the split
    unseen: Mapping[RequestClass, int] | None = None  # held-out phrasings appended, per class


# test in the traffic mix, large enough for 240 medium and 160 complex items
SPLITS = (
    SplitSpec("test", seed=3, n=4000, mix=TRAFFIC_MIX, unseen={"simple": 400, "medium": 240}),
    SplitSpec("dev", seed=2, n=2000, mix=TRAFFIC_MIX, unseen={"simple": 200, "medium": 120}),
    SplitSpec("train", seed=1, n=6000, mix=TRAIN_MIX, unique=False),
)
SPLIT_NAMES = tuple(spec.name for spec in SPLITS)


def build_splits(splits: tuple[SplitSpec, ...] = SPLITS) -> dict[str, list[WorkloadItem]]:
    """Generates every split in order, each avoiding the prompts of those before it."""
    built: dict[str, list[WorkloadItem]] = {}
    taken: set[str] = set()
    for spec in splits:
        items = generate(
            spec.seed, spec.n, spec.mix, exclude_prompts=frozenset(taken), unique=spec.unique
        )
        if spec.unseen:
            items += generate_unseen(spec.seed, dict(spec.unseen), frozenset(taken))
        taken.update(item.prompt for item in items)
        built[spec.name] = items
    return built


def write_splits(data_dir: Path = DATA_DIR) -> dict[str, Path]:
    """Regenerates the splits and writes one JSONL file per split; returns their paths."""
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    specs = {spec.name: spec for spec in SPLITS}
    for name, items in build_splits().items():
        path = data_dir / f"{name}.jsonl"
        marked = bool(specs[name].unseen)  # train (all seen) keeps the rows it was trained on
        lines = (json.dumps(item.to_json(marked), ensure_ascii=False) for item in items)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths[name] = path
    return paths


def load_split(
    name: str, data_dir: Path = DATA_DIR, phrasing: Phrasing | None = "seen"
) -> list[WorkloadItem]:
    """Reads one split from its JSONL file: its items of one phrasing ("seen" by default, the
    items every measure used before held-out phrasings existed), or all of them (None)."""
    if name not in SPLIT_NAMES:
        raise ValueError(f"unknown split {name!r}; known: {', '.join(SPLIT_NAMES)}")
    path = data_dir / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `tiermesh models workload` to write it")
    with path.open(encoding="utf-8") as handle:
        items = [WorkloadItem.from_json(json.loads(line)) for line in handle if line.strip()]
    return [i for i in items if phrasing is None or i.phrasing == phrasing]


def held_out_prompts(data_dir: Path = DATA_DIR) -> frozenset[str]:
    """Prompts of the dev and test splits, which training must never show a model."""
    return frozenset(
        item.prompt for name in ("dev", "test") for item in load_split(name, data_dir, None)
    )
