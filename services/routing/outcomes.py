"""Measured routing labels: every tier answers every request of a workload split (greedy, as
served), and each request is labelled with the cheapest tier whose answer is correct.

The outcomes (per tier: correct, output tokens, draft confidence) are data kept with the
workload (`services/workload/data/outcomes-<split>.jsonl`); predictor training, threshold
tuning and `tiermesh route-eval` read them. Runs the torch engine in this process (imported
only to build labels: reading them needs no torch).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.config import TierConfig
from services.common.config_loading import load_config
from services.common.tiers import TIER_NAMES
from services.tier.engine import GenerationRequest
from services.workload import WorkloadItem, load_split, score
from services.workload.splits import DATA_DIR

SERVICES = Path(__file__).resolve().parent.parent
# requests each tier decodes together while labelling: greedy answers are the same at any batch
# size (the engine's batching contract), and a wider batch gets more tokens out of each step
LABEL_CONCURRENCY = 64


@dataclass(frozen=True)
class TierOutcome:
    correct: bool
    tokens: int  # output tokens
    confidence: float  # geometric-mean token probability of the answer, in [0, 1]


@dataclass(frozen=True)
class Outcome:
    """How every tier did on one request, and the cheapest correct tier ("none" if none);
    `phrasing` says whether the request's wording is one training uses ("seen") or not."""

    id: str
    request_class: str
    prompt: str
    tiers: dict[str, TierOutcome]
    phrasing: str = "seen"

    @property
    def label(self) -> str:
        return next((t for t in TIER_NAMES if t in self.tiers and self.tiers[t].correct), "none")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "request_class": self.request_class,
            "prompt": self.prompt,
            "label": self.label,
            "tiers": {t: o.__dict__ for t, o in self.tiers.items()},
            "phrasing": self.phrasing,
        }

    @staticmethod
    def from_json(row: dict[str, Any]) -> Outcome:
        tiers = {t: TierOutcome(**o) for t, o in row["tiers"].items()}
        phrasing = str(row.get("phrasing", "seen"))
        return Outcome(row["id"], row["request_class"], row["prompt"], tiers, phrasing)


def outcomes_path(split: str, data_dir: Path = DATA_DIR) -> Path:
    return data_dir / f"outcomes-{split}.jsonl"


def load_outcomes(split: str, data_dir: Path = DATA_DIR) -> list[Outcome]:
    path = outcomes_path(split, data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build it with `tiermesh route label`")
    with path.open(encoding="utf-8") as f:
        return [Outcome.from_json(json.loads(line)) for line in f if line.strip()]


async def answer_all(
    model: Path,
    items: list[WorkloadItem],
    max_tokens: int,
    concurrency: int = LABEL_CONCURRENCY,
    progress: Callable[[int], None] | None = None,
    threads: int = 2,
) -> list[tuple[str, int, float]]:
    """(text, output tokens, confidence) per item from one model, with continuous batching."""
    from services.tier.torch_engine import TorchEngine  # torch: only where labels are built

    config = TierConfig(
        name="large",
        model_path=model,
        max_running=concurrency,
        max_queued=len(items),
        max_tokens=max_tokens,
        torch_threads=threads,
        tokens_per_chunk=64,
    )
    engine = TorchEngine(config)
    await engine.start()
    results: list[tuple[str, int, float]] = [("", 0, 0.0)] * len(items)
    limiter = asyncio.Semaphore(concurrency)

    async def one(index: int, item: WorkloadItem) -> None:
        request = GenerationRequest(
            request_id=item.id, messages=(("user", item.prompt),), max_tokens=max_tokens
        )
        async with limiter:
            text, logprobs = "", list[float]()
            async for chunk in engine.generate(request):
                text += chunk.text
                logprobs.extend(chunk.logprobs)
        mean = sum(logprobs) / len(logprobs) if logprobs else -math.inf
        results[index] = (text, len(logprobs), math.exp(mean))
        if progress is not None:
            progress(1)

    try:
        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    finally:
        await engine.shutdown()
    return results


def model_paths(overrides: dict[str, Path] | None = None) -> dict[str, Path]:
    paths = {}
    for tier in TIER_NAMES:
        config = load_config(TierConfig, SERVICES / f"tier_{tier}" / "config.toml")
        paths[tier] = (overrides or {}).get(tier, config.model_path)
    return paths


def build_outcomes(
    split: str,
    models: dict[str, Path],
    limit: int | None = None,
    max_tokens: int = 200,
    progress: Callable[[str, int, int], None] | None = None,
    threads: int = 2,
    previous: list[Outcome] | None = None,
    only_new: bool = False,
    concurrency: int = LABEL_CONCURRENCY,
) -> list[Outcome]:
    """Runs each tier in `models` over the split (its first `limit` items, seen and unseen
    phrasings) and scores the answers; tiers not in `models` keep their results from `previous`
    (same items). With `only_new`, items `previous` has every tier of keep its results and only
    the others are run."""
    every = load_split(split, phrasing=None)
    every = every[:limit] if limit else every
    kept = {o.id: o.tiers for o in previous or []}
    done_ids = {i for i, tiers in kept.items() if set(models) <= set(tiers)} if only_new else set()
    items = [item for item in every if item.id not in done_ids]
    per_tier: dict[str, list[tuple[str, int, float]]] = {}
    for tier, model in models.items() if items else ():
        done = 0

        def advance(n: int, tier: str = tier) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(tier, done, len(items))

        per_tier[tier] = asyncio.run(
            answer_all(model, items, max_tokens, concurrency, progress=advance, threads=threads)
        )
    positions = {item.id: index for index, item in enumerate(items)}
    outcomes = []
    for item in every:
        if item.id in done_ids:
            tiers = dict(kept[item.id])
        else:
            tiers = {t: o for t, o in kept.get(item.id, {}).items() if t not in per_tier}
            for tier, answers in per_tier.items():
                text, tokens, confidence = answers[positions[item.id]]
                tiers[tier] = TierOutcome(score(item, text), tokens, round(confidence, 5))
        outcomes.append(Outcome(item.id, item.request_class, item.prompt, tiers, item.phrasing))
    return outcomes


def write_outcomes(outcomes: Iterable[Outcome], path: Path) -> None:
    with path.open("w", encoding="utf-8") as f:
        for outcome in outcomes:
            f.write(json.dumps(outcome.to_json()) + "\n")
