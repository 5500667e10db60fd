"""Trains the byte-level BPE tokenizer the built-in models share, with its chat template.

The template renders a conversation exactly as training lays out an example, so serving's
render_prompt reproduces the training prompt. Knows nothing of models or the workload's classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

EOS_TOKEN = "<|endoftext|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (EOS_TOKEN, *ROLE_TOKENS)
# A turn is "<|role|>content\n"; the generation prompt is "<|assistant|>".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def prompt_text(question: str) -> str:
    """The prompt the models are trained on for one user question (what the template renders)."""
    return f"<|user|>{question}\n<|assistant|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """Trains a byte-level BPE (digits split one per token) and wraps it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    fast: Any = PreTrainedTokenizerFast  # transformers ships no types for it
    tokenizer = fast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 512
    return tokenizer


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """Writes tokenizer.json and tokenizer_config.json (with the chat template) to folder."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
