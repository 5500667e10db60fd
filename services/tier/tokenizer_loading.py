"""Loads a tokenizer from a local Hugging Face folder, renders and encodes prompts, and turns
generated ids back into text deltas.

Imports no torch (a tokenizer folder saved as `TokenizersBackend` / `PreTrainedTokenizerFast`
loads without it; any other class goes through AutoTokenizer, which brings transformers' config
machinery and torch with it). Never touches a model hub. Knows nothing of models or gRPC.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# tokenizer classes that load as transformers' tokenizers-backed fast tokenizer, without torch
_FAST_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_tokenizer(path: Path) -> Any:
    """The tokenizer saved in the model folder `path` (a transformers tokenizer)."""
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if config.get("tokenizer_class") in _FAST_CLASSES and (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def eos_token_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    """The end-of-sequence ids: config.json's `eos_token_id` (one id or a list), else the
    tokenizer's; empty when neither names one."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    eos = config.get("eos_token_id", tokenizer.eos_token_id)
    return frozenset(eos if isinstance(eos, list) else ([] if eos is None else [eos]))


def render_prompt(tokenizer: Any, messages: list[tuple[str, str]]) -> str:
    """Renders (role, content) turns into the prompt string the model was trained on.

    Uses the tokenizer's chat template when it has one; otherwise one "role: content" line per
    turn followed by "assistant:".
    """
    if getattr(tokenizer, "chat_template", None):
        turns = [{"role": role, "content": content} for role, content in messages]
        rendered = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        return str(rendered)
    lines = [f"{role}: {content}\n" for role, content in messages]
    return "".join(lines) + "assistant:"


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a rendered prompt, exactly as serving feeds them to the model.

    No special tokens are added: the chat template (or the raw prompt) carries any it wants.
    """
    return list(tokenizer.encode(prompt, add_special_tokens=False))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, holding back partial characters.

    Each call decodes only the ids since the last emitted text (plus the previous window, so a
    token that depends on its neighbour decodes right), never the whole sequence again.
    """

    def __init__(
        self, tokenizer: Any, continued: Sequence[int] = (), continued_chars: int | None = None
    ) -> None:
        """`continued`: tokens of the text whose first `continued_chars` characters were sent
        before (by another replica; already checked by the caller, as prepare_request does;
        None: all of their text but a split last character). The first delta is the text after
        those characters."""
        self._tokenizer = tokenizer
        self._ids: list[int] = list(continued)
        self._prefix = 0  # start of the previous window: decoded again for context only
        self._read = 0  # ids before this index are already text
        self._skip = 0  # characters of the next delta the reader has already
        if continued:
            self._skip = (
                continued_text_chars(tokenizer, continued, None)
                if continued_chars is None
                else continued_chars
            )
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return decode_text(self._tokenizer, ids)

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """Appends token ids and returns the text they add (empty while a character is split)."""
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if after.endswith("\ufffd") and not final:
            return ""
        delta = after[len(before) :]
        if self._skip:
            delta, self._skip = delta[self._skip :], 0
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta


def decode_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of answer token ids, as streamed (special tokens left out)."""
    return str(
        tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
    )


def continued_text_chars(tokenizer: Any, ids: Sequence[int], chars: int | None) -> int:
    """How many characters of `ids`' text a reader has: `chars`, or when None all of it but a
    split last character. Raises ValueError when `chars` is more than the text has."""
    text = decode_text(tokenizer, ids)
    if chars is None:
        return len(text.rstrip("\ufffd"))
    if chars > len(text):
        raise ValueError(f"{chars} characters, but those tokens make {len(text)}")
    return chars
