"""Groups a request's generated tokens into streamed chunks: the first token alone (for a fast
first token), then `per_chunk` tokens at a time, and whatever is left on the last token.

Runs on decode threads; knows the detokenizer, nothing of models or gRPC.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.tier.tokenizer_loading import IncrementalDetokenizer

END = object()  # sentinel emitted after a request's last chunk (or when it was stopped)

Emit = Callable[[Any], None]  # receives chunk tuples, then END, or an exception
Chunk = tuple[list[int], str, list[float], str | None]  # (token ids, text, log-probs, finish)


class ChunkAssembler:
    def __init__(self, tokenizer: Any, per_chunk: int) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._per_chunk = per_chunk
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._sent_first = False

    def add(self, token: int, logprob: float, finish: str | None) -> Chunk | None:
        """Adds one token; returns a chunk when one is due. `finish` marks the last token."""
        self._ids.append(token)
        self._logprobs.append(logprob)
        if finish is None and self._sent_first and len(self._ids) < self._per_chunk:
            return None
        chunk = (self._ids, self._detok.add(self._ids, final=finish is not None), self._logprobs)
        self._ids, self._logprobs, self._sent_first = [], [], True
        return (*chunk, finish)
