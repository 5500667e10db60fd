"""Evaluates a tier's checkpoint on a workload split exactly as serving runs it.

Loads with services.tier.model_loading, renders prompts with tokenizer_loading.render_prompt and
decodes greedily with services.tier.decode.decode_steps at batch 1; reports accuracy per class on
seen and on unseen (held-out) phrasings apart, decode speed, time to first token, parameters and
checkpoint size. Knows nothing of training.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from services.tier.decode import Sampling, decode_steps
from services.tier.model_loading import LoadedModel, load_causal_lm
from services.tier.tokenizer_loading import render_prompt
from services.workload import CLASSES, WorkloadItem, score
from services.workload.generator import Phrasing

MAX_NEW_TOKENS = 200  # longer than any reference answer
PHRASINGS: tuple[Phrasing, ...] = ("seen", "unseen")


@dataclass
class TierEvaluation:
    """One tier's results. accuracy and counts cover the items of seen phrasings, accuracy_unseen
    and counts_unseen those of unseen ones; one entry per class (None when it had no item)."""

    tier: str
    params: int
    bytes: int
    tokens_per_s: float
    ttft_ms: float
    accuracy: dict[str, float | None]
    counts: dict[str, int]
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (id, expected, got)
    accuracy_unseen: dict[str, float | None] = field(default_factory=dict)
    counts_unseen: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "params": self.params,
            "bytes": self.bytes,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "ttft_ms": round(self.ttft_ms, 2),
            "accuracy": _rounded(self.accuracy),
            "counts": self.counts,
            "accuracy_unseen": _rounded(self.accuracy_unseen),
            "counts_unseen": self.counts_unseen,
        }


def _rounded(accuracy: dict[str, float | None]) -> dict[str, float | None]:
    return {c: None if a is None else round(a, 4) for c, a in accuracy.items()}


@dataclass(frozen=True)
class Completion:
    """One greedy completion with its timings."""

    text: str
    tokens: int
    ttft_s: float
    decode_s: float  # from the first token to the last


def complete(loaded: LoadedModel, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS) -> Completion:
    """Greedy completion of one user question, the way the tier serves it."""
    tokenizer = loaded.tokenizer
    rendered = render_prompt(tokenizer, [("user", prompt)])
    prompt_ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    start = time.perf_counter()
    first = start
    ids: list[int] = []
    for token, _, _ in decode_steps(
        loaded.model,
        prompt_ids,
        max_new_tokens=max_new_tokens,
        sampling=Sampling(),
        eos_token_ids=loaded.eos_token_ids,
    ):
        if not ids:
            first = time.perf_counter()
        ids.append(token)
    end = time.perf_counter()
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return Completion(str(text), len(ids), first - start, end - first)


def per_class(items: Sequence[WorkloadItem], limit: int | None) -> list[WorkloadItem]:
    """The first `limit` items of each class and phrasing (all when limit is None), in split
    order: seen items first, then unseen ones."""
    kept: list[WorkloadItem] = []
    for phrasing in PHRASINGS:
        for request_class in CLASSES:
            of_class = [
                i for i in items if i.request_class == request_class and i.phrasing == phrasing
            ]
            kept.extend(of_class if limit is None else of_class[:limit])
    return kept


def evaluate_tier(
    tier: str,
    model_dir: Path,
    items: Sequence[WorkloadItem],
    dtype: str = "float32",
    on_item: Callable[[], None] = lambda: None,
) -> TierEvaluation:
    """Runs every item through the tier's model and scores it."""
    loaded = load_causal_lm(model_dir, dtype=dtype)
    correct: dict[str, dict[str, int]] = {p: dict.fromkeys(CLASSES, 0) for p in PHRASINGS}
    counts: dict[str, dict[str, int]] = {p: dict.fromkeys(CLASSES, 0) for p in PHRASINGS}
    ttfts: list[float] = []
    decode_s, decode_tokens_n = 0.0, 0
    failures: list[tuple[str, str, str]] = []
    complete(loaded, items[0].prompt)  # warm-up, not timed
    for item in items:
        done = complete(loaded, item.prompt)
        counts[item.phrasing][item.request_class] += 1
        if score(item, done.text):
            correct[item.phrasing][item.request_class] += 1
        else:
            failures.append((item.id, item.final, done.text))
        ttfts.append(done.ttft_s)
        decode_s += done.decode_s
        decode_tokens_n += max(0, done.tokens - 1)
        on_item()
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return TierEvaluation(
        tier=tier,
        params=loaded.params,
        bytes=weights,
        tokens_per_s=decode_tokens_n / decode_s if decode_s > 0 else 0.0,
        ttft_ms=1000 * statistics.median(ttfts) if ttfts else 0.0,
        accuracy=_accuracy(correct["seen"], counts["seen"]),
        counts=counts["seen"],
        failures=failures,
        accuracy_unseen=_accuracy(correct["unseen"], counts["unseen"]),
        counts_unseen=counts["unseen"],
    )


def _accuracy(correct: dict[str, int], counts: dict[str, int]) -> dict[str, float | None]:
    return {c: correct[c] / counts[c] if counts[c] else None for c in CLASSES}
