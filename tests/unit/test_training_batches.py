"""The trainer's batches: with augmentation on, reworded requests come in, no dev or test prompt
ever does, the loss counts the answer tokens only, and packing several examples into a row
changes nothing a model computes for them."""

from __future__ import annotations

from itertools import islice
from typing import Any

import pytest
import torch

from services.training.recipes import TierRecipe
from services.training.tokenizer import EOS_TOKEN, prompt_text, train_tokenizer
from services.training.trainer import (
    Batch,
    ExampleBatches,
    batch_loss,
    bf16_is_native,
    build_model,
    pack,
)
from services.workload import held_out_prompts, load_split, stream


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    texts = [prompt_text(i.prompt) + i.reference + EOS_TOKEN for i in load_split("train")[:600]]
    return train_tokenizer(texts, vocab_size=512)


def _examples(batch: Batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each example of a packed batch as (its token ids, its labels), read from where the
    positions fall back to 0; the row's padding after its last example left out."""
    examples = []
    for ids, labels, positions in zip(
        batch.input_ids, batch.labels, batch.position_ids, strict=True
    ):
        starts = (positions == 0).nonzero().flatten().tolist()
        ends = [*starts[1:], int((labels != -100).nonzero().max()) + 1]
        examples += [(ids[a:b], labels[a:b]) for a, b in zip(starts, ends, strict=True)]
    return examples


def _prompts(tokenizer: Any, batches: ExampleBatches, n: int) -> list[str]:
    prompts = []
    for _ in range(n):
        for ids, labels in _examples(batches.next_batch()):
            answer_at = int((labels != -100).nonzero()[0])
            text = tokenizer.decode(ids[:answer_at])
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


def test_pack_puts_every_example_in_one_row_within_the_width() -> None:
    lengths = [60, 10, 200, 45, 45, 120, 8, 90]
    rows = pack(lengths, 256)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 256 for row in rows)
    assert len(rows) == 3  # 578 tokens: no fewer rows of 256 can hold them
    with pytest.raises(ValueError, match="exceeds the width"):
        pack([300], 256)


def test_a_packed_batch_computes_what_one_example_a_row_does(tokenizer: Any) -> None:
    recipe = TierRecipe("tiny", n_layer=2, n_embd=32, n_head=2, lr=1e-3, budget_share=1.0)
    torch.manual_seed(0)
    model = build_model(recipe, tokenizer).eval()
    batches = ExampleBatches(tokenizer, 3, held_out_prompts(), 1024, (0.5, 0.5, 0.0, 0.0))
    for _ in range(3):
        batch = batches.next_batch()
        examples = _examples(batch)
        assert len(examples) > len(batch.input_ids), "short examples share rows"
        assert sum(len(ids) for ids, _ in examples) == batch.tokens
        width = max(len(ids) for ids, _ in examples)
        one_a_row = torch.full((len(examples), width), tokenizer.pad_token_id)
        labels = torch.full((len(examples), width), -100)
        for row, (ids, answer) in enumerate(examples):
            one_a_row[row, : len(ids)], labels[row, : len(ids)] = ids, answer
        with torch.no_grad():
            packed = batch_loss(model, batch)
            alone = model(input_ids=one_a_row, labels=labels).loss
        # an example that saw another one's tokens, or positions not from 0, would move the loss
        assert float(packed) == pytest.approx(float(alone), abs=1e-5)
