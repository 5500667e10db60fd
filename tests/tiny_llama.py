"""Builds tiny, randomly initialised Llama-family checkpoints (seeded) for tests: Llama with a
tied or untied head and optional rope scaling, Qwen2 (biased q/k/v), Mistral, all with
grouped-query attention, sharing the tiny GPT-2 checkpoint's tokenizer (tests/tiny_model.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# model_type -> the transformers config and model classes
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def build_tiny_llama(
    folder: Path,
    tokenizer_dir: Path,
    *,
    model_type: str = "llama",
    tie_word_embeddings: bool = True,
    rope_parameters: dict[str, Any] | None = None,
    seed: int = 0,
    **config: Any,
) -> Path:
    """Writes the checkpoint into `folder` (created) and returns it: 2 layers, hidden 64,
    4 query heads over 2 key/value heads, the tokenizer of `tokenizer_dir`."""
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir), local_files_only=True)
    tokenizer.save_pretrained(str(folder))
    config_class, model_class = (getattr(transformers, n) for n in ARCHITECTURES[model_type])
    settings: dict[str, Any] = {
        "vocab_size": tokenizer.vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": tokenizer.eos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "tie_word_embeddings": tie_word_embeddings,
        "initializer_range": 0.4,  # wide weights: varied, seed-dependent greedy output
        "rope_parameters": rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
    }
    settings.update(config)
    torch.manual_seed(seed)
    model = model_class(config_class(**settings))
    model.save_pretrained(str(folder))
    return folder


def build_variant(
    name: str, variants: dict[str, dict[str, Any]], factory: Any, tokenizer_dir: Path
) -> Path:
    """`variants[name]` built into a fresh folder of pytest's `tmp_path_factory`."""
    folder = factory.mktemp(name)
    return build_tiny_llama(folder, tokenizer_dir, **variants[name])
