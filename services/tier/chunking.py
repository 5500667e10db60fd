"""Groups a request's generated tokens into streamed chunks: the first token alone (for a fast
first token), then `per_chunk` tokens at a time, and whatever is left on the last token; and the
sink a decode thread sends those chunks into.

Runs on decode threads; knows the detokenizer, nothing of models, torch, asyncio or gRPC.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from services.tier.engine import GenerationChunk, TokenLogprob, TopLogprob
from services.tier.tokenizer_loading import IncrementalDetokenizer, decode_text

# each tokenizer's texts of single tokens, as the alternatives of per-token detail name them: at
# most one entry per token of its vocabulary, gone with the tokenizer (a swapped-out model's)
_TOKEN_TEXTS: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token decoded on its own (cached per tokenizer)."""
    texts = _TOKEN_TEXTS.get(tokenizer)
    if texts is None:
        texts = _TOKEN_TEXTS.setdefault(tokenizer, {})
    text = texts.get(token_id)
    if text is None:
        text = texts[token_id] = decode_text(tokenizer, [token_id])
    return text


class ChunkSink(Protocol):
    """Where a decode thread sends one request's chunks (chunk_channel.ChunkChannel).

    put() for each chunk, then exactly one of close() (the stream ended or was stopped) or
    fail(error) (decoding failed; the consumer raises the error). Called from one thread at a
    time, in order (a critical request's first chunk from the lane's, the rest from the loop's).
    """

    def put(self, item: GenerationChunk) -> None: ...

    def close(self) -> None: ...

    def fail(self, error: BaseException) -> None: ...


class ChunkAssembler:
    def __init__(
        self,
        tokenizer: Any,
        per_chunk: int,
        continued: tuple[int, ...] = (),
        continued_chars: int = 0,
        detailed: bool = False,
        held: tuple[TokenLogprob, ...] = (),
    ) -> None:
        """`continued`: answer tokens streamed before this stream (by another replica), of
        whose text the reader has `continued_chars` characters: the text after those comes
        first. `detailed`: each chunk also carries a TokenLogprob per token (the caller asked
        for sampling.top_logprobs), each token's text decoded as it comes; `held`: the entries
        of the continued tokens whose text comes first (prepared_request.held_back_entries),
        sent before the first new token's, whose own text then starts after theirs."""
        self._tokenizer = tokenizer
        self._detok = IncrementalDetokenizer(tokenizer, continued, continued_chars)
        self._per_chunk = per_chunk
        self._detailed = detailed
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._entries: list[TokenLogprob] = list(held)
        self._held_chars = sum(len(e.text) for e in held)
        self._sent_first = False

    def add(
        self,
        token: int,
        logprob: float,
        finish: str | None,
        top: tuple[tuple[int, float], ...] = (),
    ) -> GenerationChunk | None:
        """Adds one token (with the most likely tokens at its step, when detailed); returns a
        chunk when one is due. `finish` marks the last token.

        The chunk carries no usage: the engine lifecycle adds it on the last chunk.
        """
        self._ids.append(token)
        self._logprobs.append(logprob)
        if self._detailed:
            piece = self._detok.add([token], final=finish is not None)
            if self._held_chars and piece:  # the held tokens' entries carry that text
                piece, self._held_chars = piece[self._held_chars :], 0
            alternatives = tuple(TopLogprob(i, token_text(self._tokenizer, i), lp) for i, lp in top)
            self._entries.append(TokenLogprob(piece, logprob, alternatives))
        if finish is None and self._sent_first and len(self._ids) < self._per_chunk:
            return None
        if self._detailed:
            text = "".join(e.text for e in self._entries)
        else:
            text = self._detok.add(self._ids, final=finish is not None)
        chunk = GenerationChunk(
            tuple(self._ids),
            text,
            tuple(self._logprobs),
            finish,
            token_logprobs=tuple(self._entries),
        )
        self._ids, self._logprobs, self._entries, self._sent_first = [], [], [], True
        return chunk
