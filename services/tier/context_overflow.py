"""Reads a remote OpenAI-compatible server's refusal of a chat that does not fit its model's
context: how many tokens the prompt has and how large the context is, from the error's fields
(llama.cpp's) or its message (vLLM's, OpenAI's, SGLang's, TGI's, tiermesh's own gateway's).

Pure: no I/O. The openai engine turns a prompt the context cannot hold into PromptTooLong (so
the router moves the chat on to a tier that may hold it) and, for a request that lets the
context lower its max_tokens, asks again with the room the prompt leaves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ContextOverflow:
    """A chat the server's context cannot hold: the prompt's tokens and the model's whole
    context (prompt and answer)."""

    prompt_tokens: int
    context_tokens: int

    @property
    def room(self) -> int:
        """Answer tokens the prompt leaves in the context: 0 when the prompt alone is too long,
        else max_tokens was the part too large."""
        return max(0, self.context_tokens - self.prompt_tokens)


_N = r"([0-9][0-9,]*)"
# (pattern, the group of the prompt's tokens, the group of the context's, added to the context)
_MESSAGES: tuple[tuple[re.Pattern[str], int, int, int], ...] = (
    # vLLM: "This model's maximum context length is 2048 tokens. However, your prompt contains
    # 2100 input tokens, which exceeds this limit ..." (also "contains at least 2049")
    (
        re.compile(rf"maximum context length is {_N} tokens.*?contains (?:at least )?{_N} input"),
        2,
        1,
        0,
    ),
    # OpenAI: "This model's maximum context length is 8192 tokens. However, your messages
    # resulted in 9000 tokens (8800 in the messages, 200 in the completion)."
    (re.compile(rf"maximum context length is {_N} tokens.*?\({_N} in the messages"), 2, 1, 0),
    # OpenAI, the prompt alone: "... However, your messages resulted in 9000 tokens. Please
    # reduce the length of the messages."
    (re.compile(rf"maximum context length is {_N} tokens.*?resulted in {_N} tokens\."), 2, 1, 0),
    # vLLM's older check: "Input length (2100) exceeds model's maximum context length (2048)."
    (
        re.compile(rf"[Ii]nput length \({_N}\) exceeds model's maximum context length \({_N}\)"),
        1,
        2,
        0,
    ),
    # SGLang: "The input (2100 tokens) is longer than the model's context length (2048 tokens)."
    (
        re.compile(rf"input \({_N} tokens\) is longer than the model's context length \({_N}"),
        1,
        2,
        0,
    ),
    # SGLang, with the answer: "... maximum context length of 2048 tokens. You requested a total
    # of 2300 tokens: 2100 tokens from the input messages and 200 tokens for the completion."
    (
        re.compile(rf"maximum context length of {_N} tokens.*?{_N} tokens from the input"),
        2,
        1,
        0,
    ),
    # TGI: "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and
    # 200 `max_new_tokens`"
    (re.compile(rf"must be <= {_N}\. Given: {_N} `inputs` tokens"), 2, 1, 0),
    # tiermesh (its gateway in front of a router): "prompt: 2100 tokens exceeds this tier's
    # limit of 1023 tokens" / "... the largest context of the tiers that could take it (1023
    # tokens)": a limit one below the context
    (re.compile(rf"prompt: {_N} tokens exceeds this tier's limit of {_N} tokens"), 1, 2, 1),
    (re.compile(rf"prompt: {_N} tokens exceeds the largest context .*?\({_N} tokens\)"), 1, 2, 1),
    # tiermesh: "max_tokens: prompt of 50 tokens + max_tokens 400 exceeds the model's context of
    # 256 tokens"
    (
        re.compile(
            rf"prompt of {_N} tokens \+ max_tokens {_N} exceeds the model's context of {_N}"
        ),
        1,
        3,
        0,
    ),
)


def context_overflow(message: str, error: dict[str, Any] | None = None) -> ContextOverflow | None:
    """The overflow a refusal describes, or None when it is about something else. `error` is
    the body's error object where it has one (llama.cpp puts `n_prompt_tokens` and `n_ctx`
    there)."""
    if error is not None:
        prompt, context = error.get("n_prompt_tokens"), error.get("n_ctx")
        if isinstance(prompt, int) and isinstance(context, int) and context > 0:
            return ContextOverflow(prompt, context)
    for pattern, prompt_group, context_group, offset in _MESSAGES:
        match = pattern.search(message)
        if match is None:
            continue
        context = _number(match.group(context_group)) + offset
        return ContextOverflow(_number(match.group(prompt_group)), context)
    return None


def _number(text: str) -> int:
    return int(text.replace(",", ""))
