"""Builds the ChatEvent messages of a revision stream, and the common-prefix rule for revisions.

Pure functions over protobuf messages: no I/O, no gRPC calls.
"""

from __future__ import annotations

from tiermesh.v1 import common_pb2, router_pb2, tier_pb2


def common_prefix_chars(a: str, b: str) -> int:
    """Number of leading characters (code points) a and b share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KeptPrefix:
    """Decides, while a replacing revision streams in, how much of the previous text it keeps.

    The answer is known once the new text diverges from the previous one, covers all of it, or
    ends; until then the new text is held back (at most the previous revision's length).
    """

    def __init__(self, previous: str) -> None:
        self.previous = previous
        self.held = ""

    def feed(self, text: str) -> int | None:
        """Adds streamed text; returns the kept prefix length once it is decided, else None."""
        self.held += text
        common = common_prefix_chars(self.previous, self.held)
        if common < len(self.held) or len(self.held) >= len(self.previous):
            return common
        return None

    def at_end(self) -> int:
        return common_prefix_chars(self.previous, self.held)


def revision_start(
    revision: int, tier: str, replaces: int | None, kept_prefix_chars: int = 0
) -> router_pb2.ChatEvent:
    start = router_pb2.RevisionStart(
        revision=revision, tier=tier, kept_prefix_chars=kept_prefix_chars
    )
    if replaces is not None:
        start.replaces = replaces
    return router_pb2.ChatEvent(revision_start=start)


def delta(revision: int, text: str, chunks: list[tier_pb2.GenerateChunk]) -> router_pb2.ChatEvent:
    """One Delta of the chunks' tokens (and per-token entries, when asked for); a single
    chunk's are copied once, into the message."""
    if len(chunks) == 1:
        only = chunks[0]
        return router_pb2.ChatEvent(
            delta=router_pb2.Delta(
                revision=revision,
                text=text,
                token_ids=only.token_ids,
                logprobs=only.logprobs,
                token_logprobs=only.token_logprobs or None,
            )
        )
    token_ids = [t for chunk in chunks for t in chunk.token_ids]
    logprobs = [p for chunk in chunks for p in chunk.logprobs]
    entries = [e for chunk in chunks for e in chunk.token_logprobs]
    return router_pb2.ChatEvent(
        delta=router_pb2.Delta(
            revision=revision,
            text=text,
            token_ids=token_ids,
            logprobs=logprobs,
            token_logprobs=entries or None,
        )
    )


def revision_end(
    revision: int,
    finish_reason: str,
    usage: common_pb2.Usage | None,
    error: str = "",
    stop_sequence: str = "",
) -> router_pb2.ChatEvent:
    return router_pb2.ChatEvent(
        revision_end=router_pb2.RevisionEnd(
            revision=revision,
            finish_reason=finish_reason,
            usage=usage,
            error=error,
            stop_sequence=stop_sequence,
        )
    )
