"""The padded layout of a packed prefill (services/tier/prefill_attention.py): where each packed
position goes, the causal mask within each prompt, and when padding is not worth it."""

from __future__ import annotations

import torch

from services.tier.kv_pool import PrefillBatch
from services.tier.prefill_attention import MAX_PADDING_RATIO, padded_prompts

CPU = torch.device("cpu")


def _batch(lengths: list[int]) -> PrefillBatch:
    segments, start = [], 0
    for length in lengths:
        segments.append((start, start + length))
        start += length
    positions = [p for length in lengths for p in range(length)]
    return PrefillBatch(
        slots=list(range(len(lengths))),
        tokens=torch.zeros(1, start, dtype=torch.long),
        positions=torch.tensor([positions]),
        segments=segments,
        last=torch.tensor([end - 1 for _, end in segments]),
        slot_index=torch.arange(len(lengths)),
    )


def test_two_prompts_are_padded_to_the_longer_with_a_causal_mask_each() -> None:
    padded = padded_prompts(_batch([2, 3]), CPU)
    assert padded is not None and padded.steps == 3
    assert padded.gather.tolist() == [0, 1, 5, 2, 3, 4]  # 5: the zero row past the 5 positions
    assert padded.scatter.tolist() == [0, 1, 3, 4, 5]
    first, second = padded.mask[0, 0].tolist(), padded.mask[1, 0].tolist()
    assert first == [[True, False, False], [True, True, False], [True, True, False]]
    assert second == [[True, False, False], [True, True, False], [True, True, True]]


def test_one_prompt_or_too_much_padding_keeps_one_call_a_prompt() -> None:
    assert padded_prompts(_batch([7]), CPU) is None
    # 4 prompts padded to 20 would be 80 positions for 23 real ones
    assert MAX_PADDING_RATIO * 23 < 4 * 20
    assert padded_prompts(_batch([20, 1, 1, 1]), CPU) is None
    assert padded_prompts(_batch([6, 5, 5, 6]), CPU) is not None
