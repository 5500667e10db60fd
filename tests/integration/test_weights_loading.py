"""Lazy weight loading (memory-mapped safetensors assigned to an uninitialised model) gives the
same model as eager `from_pretrained`: every parameter and buffer equal, tied weights tied,
for GPT-2 and for tiny Llama (tied and untied) and Qwen2 checkpoints written by the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from services.tier.model_loading import ModelFolderError, load_causal_lm
from tests.tiny_llama import build_tiny_llama

VARIANTS: dict[str, dict[str, Any]] = {
    "llama-tied": {},
    "llama-untied": {"tie_word_embeddings": False},
    "qwen2-untied": {"model_type": "qwen2", "tie_word_embeddings": False, "seed": 2},
}


def assert_same_model(folder: Path) -> None:
    lazy = load_causal_lm(folder, "cpu", "float32", "lazy").model
    eager = load_causal_lm(folder, "cpu", "float32", "eager").model
    lazy_state, eager_state = lazy.state_dict(), eager.state_dict()
    assert lazy_state.keys() == eager_state.keys()
    for key, tensor in eager_state.items():
        assert torch.equal(lazy_state[key], tensor), key
    lazy_buffers, eager_buffers = dict(lazy.named_buffers()), dict(eager.named_buffers())
    assert lazy_buffers.keys() == eager_buffers.keys()
    for key, tensor in eager_buffers.items():
        assert torch.equal(lazy_buffers[key], tensor), key
    head, embed = lazy.get_output_embeddings(), lazy.get_input_embeddings()
    tied = head.weight.data_ptr() == embed.weight.data_ptr()
    assert tied == (
        eager.get_output_embeddings().weight.data_ptr()
        == eager.get_input_embeddings().weight.data_ptr()
    )


def test_gpt2_loads_alike_both_ways(tiny_model_dir: Path) -> None:
    assert_same_model(tiny_model_dir)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_llama_family_loads_alike_both_ways(
    variant: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    assert_same_model(build_tiny_llama(tmp_path / variant, tiny_model_dir, **VARIANTS[variant]))


def test_an_unknown_loading_is_refused_by_name(tiny_model_dir: Path) -> None:
    with pytest.raises(ModelFolderError, match="weights_loading 'mmap'"):
        load_causal_lm(tiny_model_dir, "cpu", "float32", "mmap")
