"""Stop sequences over streamed chunks: the text passed on ends just before the first stop
sequence, text that could start one is held back until the next chunk decides, and a stream that
ends on its own gets what was held back."""

from __future__ import annotations

from services.tier.engine import GenerationChunk
from services.tier.stop_sequences import StopSequences


def streamed(stops: tuple[str, ...], pieces: list[str]) -> list[tuple[str, str | None]]:
    """(text, finish_reason) of each chunk passed on, the last piece finishing by length."""
    matcher = StopSequences(stops)
    out = []
    for i, piece in enumerate(pieces):
        finish = "length" if i == len(pieces) - 1 else None
        chunk = matcher.apply(GenerationChunk((i,), piece, (0.0,), finish))
        assert chunk.token_ids == (i,)  # token ids are never cut
        out.append((chunk.text, chunk.finish_reason))
        if chunk.finish_reason is not None:
            break
    return out


def test_the_text_ends_before_the_stop_sequence_and_finishes_by_stop() -> None:
    assert streamed(("within",), ["You can return ", "any item within 30", " days"]) == [
        ("You can return ", None),
        ("any item ", "stop"),
    ]


def test_a_stop_sequence_split_over_chunks_is_never_streamed() -> None:
    assert streamed(("\n\n",), ["a\n", "\nb", "c"]) == [("a", None), ("", "stop")]


def test_held_back_text_is_released_when_it_is_not_a_stop() -> None:
    assert streamed(("\n\n",), ["a\n", "b", "c"]) == [("a", None), ("\nb", None), ("c", "length")]


def test_held_back_text_comes_with_the_streams_own_end() -> None:
    assert streamed(("END",), ["abc E", "N"]) == [("abc ", None), ("EN", "length")]


def test_the_earliest_of_several_stop_sequences_cuts() -> None:
    assert streamed(("30", "item"), ["any item within 30 days"]) == [("any ", "stop")]


def test_without_a_match_the_text_is_unchanged() -> None:
    pieces = ["You can ", "return it."]
    assert streamed(("zzz",), pieces) == [("You can ", None), ("return it.", "length")]
