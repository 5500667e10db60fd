"""A request made ready for decoding, and the rules every engine decodes it by: the prompt
rendered (chat template or raw prompt) and tokenised within the tier's prompt and context
limits, and the finish rule (an end-of-sequence token -> "stop", max_tokens -> "length").

Plain data and pure functions: knows the tokenizer helpers, nothing of torch, asyncio or gRPC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import InvalidArgument, PromptTooLong
from services.tier.engine import GenerationRequest, Sampling, TokenLogprob
from services.tier.tokenizer_loading import (
    IncrementalDetokenizer,
    continued_text_chars,
    decode_text,
    encode_prompt,
    render_prompt,
)

STOP = "stop"  # the model ended the text (an end-of-sequence token, or its decoder stopped)
LENGTH = "length"  # max_tokens were generated


@dataclass(frozen=True)
class PromptFormat:
    """What preparing a request needs to know about the loaded model."""

    tokenizer: Any  # a transformers tokenizer
    eos_token_ids: frozenset[int]
    context_length: int | None  # most positions (prompt + generated); None = not known here
    vocab_size: int | None = None  # token ids the model takes; None = the tokenizer's length


@dataclass(frozen=True)
class PreparedRequest:
    """A request an engine can decode as it is: token ids, limits and sampling."""

    request_id: str
    prompt_ids: tuple[int, ...]  # never empty; the rendered prompt, then `continued`
    max_tokens: int  # new tokens, >= 1; prompt + max_tokens fit the model's context if known
    sampling: Sampling
    tokens_per_chunk: int  # >= 1: tokens per streamed chunk after the first
    eos_token_ids: frozenset[int]
    # answer tokens streamed before (by another replica): the tail of prompt_ids, already
    # subtracted from max_tokens; the engine decodes on after them and never streams them
    continued: tuple[int, ...] = ()
    continued_chars: int = 0  # characters of the continued tokens' text the caller has
    continued_logprobs: tuple[float, ...] = ()  # one per continued token, or () = not known
    priority: str = "interactive"  # critical, interactive or batch: the order of prefills
    # whether admission has paused it for a critical request (it sits out until resumed); read
    # by an engine that can pause (admission.SlotHolder.paused), from any thread
    paused: Callable[[], bool] = field(default=lambda: False, compare=False, repr=False)

    @property
    def rendered_prompt_ids(self) -> tuple[int, ...]:
        """The prompt without the continued answer tokens."""
        return self.prompt_ids[: len(self.prompt_ids) - len(self.continued)]

    def finish_after(self, token: int | None, generated: int, *, ended: bool = False) -> str | None:
        """The finish rule for this request; see finish_reason."""
        return finish_reason(token, generated, self.max_tokens, self.eos_token_ids, ended=ended)


def finish_reason(
    token: int | None,
    generated: int,
    max_tokens: int,
    eos_token_ids: frozenset[int],
    *,
    ended: bool = False,
) -> str | None:
    """Why a stream finishes after `token`, the `generated`-th new token; None if it goes on.

    "stop" after an end-of-sequence token, else "length" once max_tokens tokens are generated.
    `ended` says the decoder has stopped on its own (TensorRT-LLM may end at an end-of-sequence
    token it does not return): then it is "stop" when neither rule holds.
    """
    if token is not None and token in eos_token_ids:
        return STOP
    if generated >= max_tokens:
        return LENGTH
    return STOP if ended else None


def prepare_request(
    request: GenerationRequest,
    prompt_format: PromptFormat,
    *,
    max_prompt_tokens: int,
    tokens_per_chunk: int,
) -> PreparedRequest:
    """Renders and tokenises the request's prompt and checks it against the limits.

    Raises InvalidArgument when the prompt renders to no tokens, is longer than the tier's
    limit (max_prompt_tokens, and one less than the model's context: PromptTooLong), or leaves
    no room in the context for max_tokens (unless the request lets the context lower it), or
    when continued answer tokens are not ones the model could have streamed (see
    check_continued). `tokens_per_chunk` is the tier's default chunk size.
    """
    tokenizer = prompt_format.tokenizer
    text = render_prompt(tokenizer, list(request.messages)) if request.messages else request.prompt
    ids = encode_prompt(tokenizer, text)
    context = prompt_format.context_length
    limit = max_prompt_tokens if context is None else min(max_prompt_tokens, context - 1)
    if not ids:
        raise InvalidArgument("prompt: renders to zero tokens")
    if len(ids) > limit:
        raise PromptTooLong(len(ids), limit)
    max_tokens = request.max_tokens
    if request.fit_to_context and context is not None:
        max_tokens = min(max_tokens, context - len(ids))  # at least 1: the prompt is in limit
    if context is not None and len(ids) + max_tokens > context:
        raise InvalidArgument(
            f"max_tokens: prompt of {len(ids)} tokens + max_tokens {request.max_tokens} "
            f"exceeds the model's context of {context} tokens"
        )
    continued, continued_chars = check_continued(request, prompt_format, max_tokens)
    return PreparedRequest(
        request_id=request.request_id,
        prompt_ids=(*ids, *continued),
        max_tokens=max_tokens - len(continued),
        sampling=request.sampling,
        tokens_per_chunk=request.tokens_per_chunk or tokens_per_chunk,
        eos_token_ids=prompt_format.eos_token_ids,
        continued=continued,
        continued_chars=continued_chars,
        continued_logprobs=request.continue_logprobs
        if len(request.continue_logprobs) == len(continued)
        else (),
        priority=request.priority,
    )


def check_continued(
    request: GenerationRequest, prompt_format: PromptFormat, max_tokens: int | None = None
) -> tuple[tuple[int, ...], int]:
    """The request's continued answer tokens and how many characters of their text the caller
    has, checked: fewer tokens than max_tokens, each within the model's vocabulary (an id past
    it would fail the whole batch step), none an end-of-sequence token (the answer would have
    ended there), no more characters than their text has (none without tokens). Raises
    InvalidArgument naming the first fault. `max_tokens`: the request's, as the context fits
    it (default: as asked)."""
    continued = request.continue_ids
    max_tokens = request.max_tokens if max_tokens is None else max_tokens
    if not continued:
        if request.continue_chars:  # characters of no tokens: more than their text has
            raise InvalidArgument(
                f"continue_text_chars: {request.continue_chars} characters, but "
                "continue_token_ids is empty"
            )
        return (), 0
    if len(continued) > max_tokens:
        raise InvalidArgument(
            f"continue_token_ids: {len(continued)} tokens are more than max_tokens {max_tokens}"
        )
    vocab = prompt_format.vocab_size or len(prompt_format.tokenizer)
    for index, token in enumerate(continued):
        if token >= vocab:
            raise InvalidArgument(
                f"continue_token_ids[{index}]: {token} is not in the model's vocabulary "
                f"of {vocab} tokens"
            )
        if token in prompt_format.eos_token_ids:
            raise InvalidArgument(
                f"continue_token_ids[{index}]: {token} is an end-of-sequence token"
            )
    try:
        chars = continued_text_chars(prompt_format.tokenizer, continued, request.continue_chars)
    except ValueError as e:
        raise InvalidArgument(f"continue_text_chars: {e}") from None
    return tuple(continued), chars


def held_back_text(prepared: PreparedRequest, prompt_format: PromptFormat) -> str:
    """The text of the continued tokens the caller does not have yet (a character they split)."""
    return decode_text(prompt_format.tokenizer, prepared.continued)[prepared.continued_chars :]


def held_back_entries(prepared: PreparedRequest, tokenizer: Any) -> tuple[TokenLogprob, ...]:
    """With per-token detail, the entries of the continued tokens whose text the caller does
    not have yet (held back by the broken stream, as a stop sequence does): each token's text
    as it was streamed, cut to what follows the caller's characters, with the log-probability
    the caller sent and no alternatives. () when there are none or their log-probabilities are
    not known (their text then goes with the first new token's entry)."""
    if prepared.sampling.top_logprobs is None or not prepared.continued_logprobs:
        return ()
    detok = IncrementalDetokenizer(tokenizer)
    entries, end = [], 0
    for token, logprob in zip(prepared.continued, prepared.continued_logprobs, strict=True):
        piece = detok.add([token])
        start, end = end, end + len(piece)
        if end > prepared.continued_chars:
            text = piece[max(0, prepared.continued_chars - start) :]
            entries.append(TokenLogprob(text, logprob))
    return tuple(entries)
