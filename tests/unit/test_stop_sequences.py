"""Stop sequences over streamed chunks: the text passed on ends just before the first stop
sequence, text that could start one is held back until the next chunk decides, and a stream that
ends on its own gets what was held back."""

from __future__ import annotations

from services.tier.engine import GenerationChunk, TokenLogprob
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


def test_the_stop_sequence_that_cut_is_named_on_the_last_chunk() -> None:
    matcher = StopSequences(("30", "item"))
    cut = matcher.apply(GenerationChunk((0,), "any item within 30 days", (0.0,)))
    assert (cut.finish_reason, cut.stop_sequence) == ("stop", "item")
    ended = StopSequences(("zzz",)).apply(GenerationChunk((0,), "done", (0.0,), "length"))
    assert ended.stop_sequence == ""


def test_without_a_match_the_text_is_unchanged() -> None:
    pieces = ["You can ", "return it."]
    assert streamed(("zzz",), pieces) == [("You can ", None), ("return it.", "length")]


def entry_stream(
    stops: tuple[str, ...], tokens: list[list[str]]
) -> list[tuple[str, list[str], str | None]]:
    """Chunks of per-token texts: (text, entry texts, finish) of each chunk passed on."""
    matcher = StopSequences(stops)
    out = []
    for i, pieces in enumerate(tokens):
        finish = "length" if i == len(tokens) - 1 else None
        entries = tuple(TokenLogprob(p, -0.5) for p in pieces)
        chunk = GenerationChunk(
            tuple(range(len(pieces))),
            "".join(pieces),
            (-0.5,) * len(pieces),
            finish,
            token_logprobs=entries,
        )
        passed = matcher.apply(chunk)
        out.append((passed.text, [e.text for e in passed.token_logprobs], passed.finish_reason))
        if passed.finish_reason is not None:
            break
    return out


def test_token_entries_follow_the_text_passed_on() -> None:
    # " ite" could begin " items": held back, and its tokens' entries with it
    assert entry_stream((" items!",), [["a", " ite"], ["m", " here"], ["."]]) == [
        ("a", ["a"], None),
        (" item here", [" ite", "m", " here"], None),
        (".", ["."], "length"),
    ]


def test_a_token_straddling_a_stop_keeps_its_text_before_it() -> None:
    assert entry_stream(("30",), [["You", " within 3"], ["0 days", "."]]) == [
        # "3" may start "30": the text passed on ends where a token does, so " within 3" waits
        ("You", ["You"], None),
        (" within ", [" within "], "stop"),  # cut at the stop; "0 days" and "." never sent
    ]


def test_a_token_that_begins_with_the_stop_is_not_sent() -> None:
    assert entry_stream(("30",), [["a", " b", "30"], ["x"]]) == [("a b", ["a", " b"], "stop")]


def test_an_empty_token_goes_with_the_text_around_it() -> None:
    # a token that ends inside a character adds nothing; it goes with its neighbours
    assert entry_stream(("zz",), [["a", ""], ["é", "b"], ["c"]]) == [
        ("a", ["a", ""], None),
        ("éb", ["é", "b"], None),
        ("c", ["c"], "length"),
    ]
