"""Loads a causal LM and its tokenizer from a local Hugging Face folder, and renders prompts.

Never touches a model hub: every load passes local_files_only. Knows nothing of gRPC.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REQUIRED_FILES = ("config.json", "tokenizer.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelFolderError(ValueError):
    """The model folder is missing or incomplete; the message says which file and where."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for decoding, with what the engine needs to know about it."""

    model: Any  # a transformers causal LM in eval mode
    tokenizer: Any  # a transformers PreTrainedTokenizerFast
    name: str  # the folder's name
    device: torch.device
    eos_token_ids: frozenset[int]
    context_length: int  # most positions the model can attend over (prompt + generated)
    params: int
    weights_bytes: int


def check_model_folder(path: Path) -> None:
    """Raises ModelFolderError naming what is missing from a Hugging Face model folder."""
    if not path.is_dir():
        raise ModelFolderError(f"model folder {path} does not exist")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ModelFolderError(f"model folder {path} lacks {', '.join(missing)}")


def load_causal_lm(path: Path, device: str = "cpu", dtype: str = "float32") -> LoadedModel:
    """Loads the model and tokenizer in `path` onto `device` with weights in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # a per-tensor progress bar for a load of well under a second is noise in service logs and in
    # every tool that loads the tiers (eval, labelling)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    check_model_folder(path)
    if dtype not in DTYPES:
        raise ModelFolderError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelFolderError(f"device {device!r} requested but CUDA is not available")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(
        str(path), local_files_only=True, dtype=DTYPES[dtype]
    )
    model.to(device)
    model.eval()
    config = json.loads((path / "config.json").read_text())
    eos = config.get("eos_token_id", tokenizer.eos_token_id)
    eos_ids = frozenset(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
    context = int(config.get("n_positions") or config.get("max_position_embeddings") or 1024)
    params = sum(p.numel() for p in model.parameters())
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=path.resolve().name if path.name != "model" else path.resolve().parent.name,
        device=torch.device(device),
        eos_token_ids=eos_ids,
        context_length=context,
        params=params,
        weights_bytes=weights_bytes,
    )


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

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0  # start of the previous window: decoded again for context only
        self._read = 0  # ids before this index are already text
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return str(
            self._tokenizer.decode(
                ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        )

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """Appends token ids and returns the text they add (empty while a character is split)."""
        self._ids.extend(token_ids)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if after.endswith("\ufffd") and not final:
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta
