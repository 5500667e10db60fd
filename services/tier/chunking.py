"""Groups a request's generated tokens into streamed chunks: the first token alone (for a fast
first token), then `per_chunk` tokens at a time, and whatever is left on the last token; and the
sink a decode thread sends those chunks into.

Runs on decode threads; knows the detokenizer, nothing of models, torch, asyncio or gRPC.
"""

from __future__ import annotations

from typing import Any, Protocol

from services.tier.engine import GenerationChunk
from services.tier.tokenizer_loading import IncrementalDetokenizer


class ChunkSink(Protocol):
    """Where a decode thread sends one request's chunks (chunk_channel.ChunkChannel).

    put() for each chunk, then exactly one of close() (the stream ended or was stopped) or
    fail(error) (decoding failed; the consumer raises the error). Called from one thread.
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
    ) -> None:
        """`continued`: answer tokens streamed before this stream (by another replica), of
        whose text the reader has `continued_chars` characters: the text after those comes
        first."""
        self._detok = IncrementalDetokenizer(tokenizer, continued, continued_chars)
        self._per_chunk = per_chunk
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._sent_first = False

    def add(self, token: int, logprob: float, finish: str | None) -> GenerationChunk | None:
        """Adds one token; returns a chunk when one is due. `finish` marks the last token.

        The chunk carries no usage: the engine lifecycle adds it on the last chunk.
        """
        self._ids.append(token)
        self._logprobs.append(logprob)
        if finish is None and self._sent_first and len(self._ids) < self._per_chunk:
            return None
        text = self._detok.add(self._ids, final=finish is not None)
        chunk = GenerationChunk(tuple(self._ids), text, tuple(self._logprobs), finish)
        self._ids, self._logprobs, self._sent_first = [], [], True
        return chunk
