"""Stop sequences over a stream of text chunks: the text passed on ends just before the first
stop sequence it would contain, and text that could be the start of one is held back until the
next chunk says whether it is.

So the text streamed never contains a stop sequence and never ends in a proper prefix of one;
a stream that another replica continues (it starts after the text the caller has) can therefore
be matched afresh. Pure: knows strings and GenerationChunk, nothing of models or gRPC.
"""

from __future__ import annotations

from dataclasses import replace

from services.tier.engine import GenerationChunk, TokenLogprob
from services.tier.prepared_request import STOP


class StopSequences:
    """One stream's matcher; feed it every chunk in order with `apply`."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        if not stops or not all(stops):
            raise ValueError(f"stop sequences must be non-empty strings, got {stops!r}")
        self._stops = stops
        self._longest = max(len(s) for s in stops)
        self._held = ""  # text received but not passed on: it could start a stop sequence
        # per-token entries (TokenLogprob) whose text is not passed on yet: the text passed on
        # always ends where a token's does, so theirs is the held text
        self._entries: list[TokenLogprob] = []

    def apply(self, chunk: GenerationChunk) -> GenerationChunk:
        """The chunk as the caller sees it: its text cut at a stop sequence (then finished,
        "stop") or short of a possible one's start; at the stream's own end, with what was
        held back. Token ids and logprobs are left as they are; per-token entries follow the
        text passed on (an entry goes with the chunk that passes the end of its text; at a
        stop, the entry it cuts keeps its text before the stop and later ones are dropped)."""
        text = self._held + chunk.text
        self._entries.extend(chunk.token_logprobs)
        found = [(i, stop) for stop in self._stops if (i := text.find(stop)) >= 0]
        if found:
            cut, stop = min(found, key=lambda f: f[0])  # the first in the text
            self._held = ""
            entries = self._release(cut, at_stop=True)
            return replace(
                chunk,
                text=text[:cut],
                finish_reason=STOP,
                token_logprobs=entries,
                stop_sequence=stop,
            )
        if chunk.finish_reason is not None:
            self._held = ""
            entries, self._entries = tuple(self._entries), []
            return replace(chunk, text=text, token_logprobs=entries)
        keep = self._possible_start(text)
        if self._entries:  # per-token detail: pass text on only up to a token's end
            keep = self._last_token_end(keep)
        self._held = text[keep:]
        return replace(chunk, text=text[:keep], token_logprobs=self._release(keep))

    def _last_token_end(self, keep: int) -> int:
        """The end of the last pending entry's text at or before `keep` (in this call's text),
        so that the text passed on ends where a token's does: a stream continued on another
        replica after it then starts at a token, and no token's text is split between
        entries."""
        best, end = 0, 0
        for entry in self._entries:
            end += len(entry.text)
            if end > keep:
                break
            best = end
        return best

    def _release(self, upto: int, at_stop: bool = False) -> tuple[TokenLogprob, ...]:
        """The pending entries to send once the first `upto` characters of their text are
        passed on: those whose text ends within them (at a stop: those that begin before it,
        the last cut there, and no others)."""
        released: list[TokenLogprob] = []
        start = 0
        while self._entries:
            entry = self._entries[0]
            end = start + len(entry.text)
            if at_stop:
                if start >= upto:
                    break
                if end > upto:
                    entry = replace(entry, text=entry.text[: max(0, upto - start)])
            elif end > upto:
                break
            released.append(entry)
            self._entries.pop(0)
            start = end
        if at_stop:
            self._entries = []
        return tuple(released)

    def _possible_start(self, text: str) -> int:
        """Where the longest tail of `text` that begins some stop sequence starts (len(text)
        when none does)."""
        for start in range(max(0, len(text) - self._longest + 1), len(text)):
            tail = text[start:]
            if any(s.startswith(tail) for s in self._stops):
                return start
        return len(text)
