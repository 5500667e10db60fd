"""The trainer's batches: with augmentation on, reworded requests come in, no dev or test prompt
ever does, and the loss counts the answer tokens only."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest

from services.training.tokenizer import EOS_TOKEN, prompt_text, train_tokenizer
from services.training.trainer import ExampleBatches, bf16_is_native
from services.workload import held_out_prompts, load_split, stream


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    texts = [prompt_text(i.prompt) + i.reference + EOS_TOKEN for i in load_split("train")[:600]]
    return train_tokenizer(texts, vocab_size=512)


def _prompts(tokenizer: Any, batches: ExampleBatches, n: int) -> list[str]:
    prompts = []
    for _ in range(n):
        _, ids, labels, _ = batches.next_batch()
        for row, row_labels in zip(ids, labels, strict=True):
            answer_at = int((row_labels != -100).nonzero()[0])
            text = tokenizer.decode(row[:answer_at])
            prompts.append(text.removeprefix("<|user|>").removesuffix("\n<|assistant|>"))
    return prompts


def test_augmented_batches_never_hold_a_held_out_prompt(tokenizer: Any) -> None:
    held_out = held_out_prompts()
    mix = (0.5, 0.5, 0.0, 0.0)  # simple and medium batches only
    batches = ExampleBatches(tokenizer, 1, held_out, 1024, mix, augment=True)
    prompts = _prompts(tokenizer, batches, 40)
    unseen = {i.prompt for n in ("dev", "test") for i in load_split(n, phrasing="unseen")}
    assert not set(prompts) & unseen
    # a dev or test prompt in training is only ever a seen simple one (a fixed set, by design)
    seen_simple = {i.prompt for i in islice(stream(1, "simple"), 5000)}
    assert set(prompts) & held_out <= seen_simple
    generated = seen_simple | {i.prompt for i in islice(stream(1, "medium"), 5000)}
    assert len(set(prompts) - generated) > len(prompts) // 3, "most prompts are reworded"


def test_without_augmentation_batches_hold_generated_prompts_only(tokenizer: Any) -> None:
    batches = ExampleBatches(tokenizer, 1, held_out_prompts(), 1024, (1.0, 0.0, 0.0, 0.0))
    generated = {i.prompt for i in islice(stream(1, "simple"), 5000)}
    assert set(_prompts(tokenizer, batches, 5)) <= generated


def test_bf16_is_used_only_where_the_cpu_has_it() -> None:
    assert isinstance(bf16_is_native(), bool)
