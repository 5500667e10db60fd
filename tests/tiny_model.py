"""Builds a tiny, randomly initialised GPT-2-shaped checkpoint (seeded) for tests.

A real Hugging Face folder (config.json, model.safetensors, tokenizer.json) that the torch engine
loads like any other model; its output is deterministic noise, which is all the mesh tests need.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = [
    "What is your return policy? Items can be returned within 30 days.",
    "How much does the blue kettle cost? It costs 24 dollars.",
    "Shipping is free on orders over 50 dollars. Delivery takes 3 to 5 days.",
    "The total for 2 mugs and 1 teapot with a 10 percent discount is 36 dollars.",
    "Hello, thank you for asking. We are happy to help you with your order today.",
]


def build_tiny_model(
    folder: Path, seed: int = 0, layers: int = 2, width: int = 64, context: int = 512
) -> Path:
    """Writes the checkpoint into `folder` (created) and returns it; `context`: its positions."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    torch.manual_seed(seed)
    eos = fast.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(
        vocab_size=fast.vocab_size,
        n_positions=context,
        n_embd=width,
        n_layer=layers,
        n_head=2,
        bos_token_id=eos,
        eos_token_id=eos,
        initializer_range=0.4,  # wide weights: varied, seed-dependent greedy output
    )
    model = GPT2LMHeadModel(config)
    model.save_pretrained(str(folder))
    return folder
