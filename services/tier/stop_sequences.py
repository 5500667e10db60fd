"""Stop sequences over a stream of text chunks: the text passed on ends just before the first
stop sequence it would contain, and text that could be the start of one is held back until the
next chunk says whether it is.

So the text streamed never contains a stop sequence and never ends in a proper prefix of one;
a stream that another replica continues (it starts after the text the caller has) can therefore
be matched afresh. Pure: knows strings and GenerationChunk, nothing of models or gRPC.
"""

from __future__ import annotations

from dataclasses import replace

from services.tier.engine import GenerationChunk
from services.tier.prepared_request import STOP


class StopSequences:
    """One stream's matcher; feed it every chunk in order with `apply`."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        if not stops or not all(stops):
            raise ValueError(f"stop sequences must be non-empty strings, got {stops!r}")
        self._stops = stops
        self._longest = max(len(s) for s in stops)
        self._held = ""  # text received but not passed on: it could start a stop sequence

    def apply(self, chunk: GenerationChunk) -> GenerationChunk:
        """The chunk as the caller sees it: its text cut at a stop sequence (then finished,
        "stop") or short of a possible one's start; at the stream's own end, with what was
        held back. Token ids and logprobs are left as they are."""
        text = self._held + chunk.text
        cut = min((i for i in (text.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return replace(chunk, text=text[:cut], finish_reason=STOP)
        if chunk.finish_reason is not None:
            self._held = ""
            return replace(chunk, text=text)
        keep = self._possible_start(text)
        self._held = text[keep:]
        return replace(chunk, text=text[:keep])

    def _possible_start(self, text: str) -> int:
        """Where the longest tail of `text` that begins some stop sequence starts (len(text)
        when none does)."""
        for start in range(max(0, len(text) - self._longest + 1), len(text)):
            tail = text[start:]
            if any(s.startswith(tail) for s in self._stops):
                return start
        return len(text)
